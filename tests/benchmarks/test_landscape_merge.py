"""benchmarks/landscape_merge.py: sessions joined once each, a grid kept, bad input refused."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from benchmarks import landscape_merge
from benchmarks.landscape_points import grid
from evokernel.analysis.landscape import Landscape
from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.workload import load_workload

SHAPES = ["s0", "s1"]


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=3, method="judge-graph")


def record(candidate: Candidate, ms: float, shapes: list[str] = SHAPES) -> str:
    evaluation = Evaluation(
        candidate_id=candidate.id, status=Status.PASSED,
        shapes=tuple(ShapeResult(shape=s, status=Status.PASSED, timing=timing(ms), reference=timing(10.0))
                     for s in shapes))
    return json.dumps({"candidate": candidate.model_dump(mode="json"),
                       "evaluation": evaluation.model_dump(mode="json"), "shapes": shapes})


@pytest.fixture(scope="module")
def points() -> list[Candidate]:
    """Points of a small cuda_family grid (MS_STAGES x MS_WARPS), the others at defaults."""
    (seed,) = [s for s in load_workload("dsa_topk").seeds() if s.name == "cuda_family"]
    return [c for _, c in grid(seed, ["MS_STAGES", "MS_WARPS"], 0)]


def test_sessions_join_once_each_and_the_grid_is_kept(points: list[Candidate], tmp_path: Path) -> None:
    (seed,) = [s for s in load_workload("dsa_topk").seeds() if s.name == "cuda_family"]
    off_grid = [c for _, c in grid(seed, ["MS_CTAS"], 0) if c.params["MS_CTAS"] != seed.params["MS_CTAS"]]
    first = tmp_path / "a.jsonl"
    first.write_text("\n".join(record(c, 1.0) for c in points[:5] + off_grid[:2]) + "\n")
    second = tmp_path / "b.jsonl.xz"  # a later session, one point again (its first figure wins)
    second.write_bytes(lzma.compress(("\n".join(record(c, 2.0) for c in points[4:]) + "\n").encode()))
    out = tmp_path / "merged.jsonl.xz"
    code = landscape_merge.main([str(first), str(second), "--out", str(out), "--workload", "dsa_topk",
                                 "--seed", "cuda_family", "--grid", "MS_STAGES,MS_WARPS"])
    assert code == 0
    merged = Landscape.load(out)
    assert len(merged) == len(points)  # the whole grid, each point once, the off-grid ones dropped
    assert {c.id for c in merged.replay.candidates()} == {c.id for c in points}
    repeated = merged.replay.evaluate(points[4], SHAPES)
    assert repeated.shapes[0].timing is not None and repeated.shapes[0].timing.median_ms == 1.0
    _, counts = landscape_merge.merge([first, second])
    assert counts == {"read": len(points) + 3, "repeated": 1, "outside_grid": 0, "kept": len(points) + 2}


def test_bad_input_is_one_line_and_exit_2(points: list[Candidate], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one.jsonl"
    one.write_text(record(points[0], 1.0) + "\n")
    other = tmp_path / "other.jsonl"
    other.write_text(record(points[1], 1.0, ["s0"]) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    cases = [
        ([str(one), str(other), "--out", str(tmp_path / "m.jsonl")], "different shape sets"),
        ([str(bad), "--out", str(tmp_path / "m.jsonl")], "bad.jsonl:1: not a landscape record"),
        ([str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "m.jsonl")], "cannot read landscape"),
        ([str(one), "--out", str(tmp_path / "m.txt")], "name it .jsonl or .jsonl.xz"),
        ([str(one), "--out", str(tmp_path / "nowhere" / "m.jsonl")], "no folder"),
        ([str(one), "--out", str(tmp_path / "m.jsonl"), "--grid", "MS_WARPS"], "needs --workload and --seed"),
        ([str(one), "--out", str(tmp_path / "m.jsonl"), "--workload", "dsa_topk", "--seed", "nope",
          "--grid", "MS_WARPS"], "has no seed 'nope'"),
        ([str(one), "--out", str(tmp_path / "m.jsonl"), "--workload", "dsa_topk", "--seed", "cuda_family",
          "--grid", "NOT_A_KNOB"], "declares no parameter"),
    ]
    for argv, message in cases:
        assert landscape_merge.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.jsonl").exists()
