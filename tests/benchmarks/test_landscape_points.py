"""benchmarks/landscape_points.py: which points a landscape run measures, in what order."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from benchmarks.landscape_points import (
    LandscapeFileError,
    Point,
    grid,
    landscape_points,
    measured_ids,
    one_at_a_time,
)
from benchmarks.topk_family_gpu import hand_choice
from evokernel import constraints as rules
from evokernel.candidate import Candidate
from evokernel.workload import load_workload

WORKLOAD = "dsa_sparse_attention"


@pytest.fixture(scope="module")
def seeds() -> dict[str, Candidate]:
    return {s.name: s for s in load_workload(WORKLOAD).seeds()}


def neighbour_count(seed: Candidate) -> int:
    return sum(len(p.choices) - 1 for p in seed.space.values())


def take(points: object, n: int) -> list[Point]:
    return list(itertools.islice(points, n))  # type: ignore[call-overload]


def write_landscape(path: Path, candidates: list[Candidate], shapes: list[str]) -> None:
    with path.open("w") as f:
        for c in candidates:
            evaluation = {"candidate_id": c.id, "status": "SKIPPED", "feedback": "no GPU"}
            f.write(json.dumps({"candidate": c.model_dump(mode="json"), "evaluation": evaluation,
                                "shapes": shapes}) + "\n")


def test_defaults_then_neighbours_then_draws_with_the_seeds_in_turn(seeds: dict[str, Candidate]) -> None:
    split, mma = seeds["triton_split"], seeds["cuda_mma"]
    n_split, n_mma = neighbour_count(split), neighbour_count(mma)
    assert n_split > 0 and n_mma > 0
    points = take(landscape_points([split, mma], sample_seed=1), 2 + n_split + n_mma + 40)

    assert [(p.seed, p.kind) for p in points[:2]] == [("triton_split", "default"), ("cuda_mma", "default")]
    assert points[0].candidate == split and points[1].candidate == mma
    neighbours = points[2:2 + n_split + n_mma]
    assert {p.kind for p in neighbours} == {"neighbour"}
    # in turn while both have some left, then the rest of the longer list
    both = min(n_split, n_mma)
    longer = "triton_split" if n_split > n_mma else "cuda_mma"
    expected = ["triton_split", "cuda_mma"] * both + [longer] * abs(n_split - n_mma)
    assert [p.seed for p in neighbours] == expected
    assert [p.label for p in neighbours if p.seed == "cuda_mma"] == [label for label, _ in one_at_a_time(mma)]
    for p in neighbours:
        seed = seeds[p.seed]
        changed = [k for k, v in p.candidate.params.items() if v != seed.params[k]]
        assert len(changed) == 1 and p.label.startswith(f"{p.seed}.{changed[0]}=")
    draws = points[2 + n_split + n_mma:]
    assert {p.kind for p in draws} == {"sample"}
    assert [p.seed for p in draws] == ["triton_split", "cuda_mma"] * 20
    # draws move knobs and launch parameters alike
    moved = {k for p in draws for k, v in p.candidate.params.items() if v != seeds[p.seed].params[k]}
    assert moved >= set(split.launch_space) | set(split.knob_space)


def test_no_point_is_listed_twice(seeds: dict[str, Candidate]) -> None:
    points = take(landscape_points([seeds["triton_split"], seeds["cuda_mma"]], sample_seed=3), 600)
    ids = [p.candidate.id for p in points]
    assert len(ids) == 600 and len(set(ids)) == 600


def test_a_small_space_is_listed_whole_then_the_list_ends(seeds: dict[str, Candidate]) -> None:
    gather = seeds["torch_gather"]  # 4 knobs of 2 values: 16 points
    points = list(landscape_points([gather], sample_seed=0))
    assert len(points) == len({p.candidate.id for p in points}) == 16
    assert [p.kind for p in points[:5]] == ["default"] + ["neighbour"] * 4


def test_points_of_an_earlier_landscape_are_not_listed_again(seeds: dict[str, Candidate], tmp_path: Path) -> None:
    shapes = load_workload(WORKLOAD).resolve_shapes("smoke")
    chosen = [seeds["triton_split"], seeds["cuda_mma"]]
    before = take(landscape_points(chosen, sample_seed=5), 120)
    # an earlier session measured the first default, every third point and some draws
    earlier = [before[0], *before[3::3]]
    path = tmp_path / "earlier.jsonl"
    write_landscape(path, [p.candidate for p in earlier], shapes)
    skip = measured_ids([path], shapes)
    assert skip == {p.candidate.id for p in earlier}

    after = take(landscape_points(chosen, sample_seed=5, measured=skip), 120)
    assert not {p.candidate.id for p in after} & skip
    assert after[0].kind == "default" and after[0].seed == "cuda_mma"
    for name in ("triton_split", "cuda_mma"):  # each seed's own order is kept, minus the skipped
        mine_before = [p.candidate.id for p in before if p.seed == name and p.candidate.id not in skip]
        mine_after = [p.candidate.id for p in after if p.seed == name]
        common = min(len(mine_before), len(mine_after))
        assert common > 30 and mine_after[:common] == mine_before[:common]


def test_a_seeds_draws_do_not_depend_on_the_other_seeds_named(seeds: dict[str, Candidate]) -> None:
    def draws(named: list[Candidate], sample_seed: int) -> list[str]:
        points = take(landscape_points(named, sample_seed), 200)
        return [p.candidate.id for p in points if p.seed == "triton_split" and p.kind == "sample"][:20]

    alone = draws([seeds["triton_split"]], 7)
    assert alone == draws([seeds["cuda_mma"], seeds["triton_split"]], 7)
    assert alone != draws([seeds["triton_split"]], 8)


def test_a_seed_named_twice_is_refused(seeds: dict[str, Candidate]) -> None:
    with pytest.raises(ValueError, match="named twice"):
        next(landscape_points([seeds["cuda_mma"], seeds["cuda_mma"]], 0))


def test_an_unusable_skip_file_is_a_one_line_error(seeds: dict[str, Candidate], tmp_path: Path) -> None:
    workload = load_workload(WORKLOAD)
    smoke, quick = workload.resolve_shapes("smoke"), workload.resolve_shapes("quick")
    other = tmp_path / "quick.jsonl"
    write_landscape(other, [seeds["cuda_mma"]], quick)
    with pytest.raises(LandscapeFileError, match="other shapes"):
        measured_ids([other], smoke)
    assert measured_ids([other]) == {seeds["cuda_mma"].id}  # no shapes given: not checked
    broken = tmp_path / "broken.jsonl"
    broken.write_text(other.read_text() + '{"candidate": {"name": 1}}\n')
    with pytest.raises(LandscapeFileError, match=r"broken.jsonl:2: not a landscape record"):
        measured_ids([broken], quick)
    with pytest.raises(LandscapeFileError, match="cannot read"):
        measured_ids([tmp_path / "absent.jsonl"])


def test_a_grid_is_every_valid_combination_of_its_parameters_once_in_a_seeded_order() -> None:
    # the hand choice scores by mma.sync, which takes every load (wgmma needs cp.async)
    family = hand_choice({s.name: s for s in load_workload("dsa_topk").seeds()}["cuda_family"])
    names = ["MS_LOAD", "MS_STAGES", "MS_SWIZZLE"]
    listed = grid(family, names, sample_seed=1)
    combos = [{n: c.params[n] for n in names} for _, c in listed]
    # MS_LOAD ldg allows at most 2 stages and only cp_async swizzles: 2 + 4 * 2 + 4 = 14 of 24
    assert len(combos) == 14 == len({tuple(c.values()) for c in combos})
    declared = rules.check_declared(family.constraints, family.space)
    assert all(not rules.violated(declared, c.params) for _, c in listed)
    others = [n for n in family.space if n not in names]
    assert all(c.params[n] == family.params[n] for _, c in listed for n in others)
    assert [label for label, _ in listed] == [f"cuda_family.grid:{i:04d}" for i in range(14)]
    assert [c.id for _, c in grid(family, names, sample_seed=1)] == [c.id for _, c in listed]
    assert [c.id for _, c in grid(family, names, sample_seed=2)] != [c.id for _, c in listed]
    with pytest.raises(ValueError, match="NOT_A_KNOB"):
        grid(family, ["NOT_A_KNOB"], sample_seed=1)


def test_with_a_grid_the_points_are_the_defaults_then_the_grid_and_nothing_else(
        seeds: dict[str, Candidate]) -> None:
    split = seeds["triton_split"]
    names = ["num_warps", "num_stages"]
    points = list(landscape_points([split], sample_seed=1, grid_names=names))
    assert points[0].kind == "default"
    assert {p.kind for p in points[1:]} == {"grid"}
    expected = {c.id for _, c in grid(split, names, 1)} - {split.id}
    assert {p.candidate.id for p in points[1:]} == expected
