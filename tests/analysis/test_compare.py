"""The compare CLI on a synthetic replay landscape: runs, tables, determinism, bad input."""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import pandas as pd
import pytest

from evokernel.analysis import compare
from evokernel.analysis.landscape import (
    Landscape,
    LandscapeError,
    default_landscape,
    grid,
    record_grid,
    valid_points,
)
from evokernel.testing import FakeEvaluator, FakeWorkload

FAKE = ["--workload", "fake", "--set", "workload_loader=evokernel.testing:load_fake_workload"]
STRATEGIES = "ga,me,random,greedy,optuna"


def fake_landscape(path: Path, keep: int | None = None) -> Path:
    """The fake_a seed's 60-point knob grid (THREADS fixed), measured by the fake evaluator."""
    candidates = grid(FakeWorkload().seeds()[0])
    record_grid(candidates[:keep], FakeEvaluator(), ["s0", "s1"], path)
    return path


@pytest.fixture(scope="module")
def landscape(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_landscape(tmp_path_factory.mktemp("landscape") / "fake_a.jsonl")


def run_compare(out: Path, landscape: Path, *extra: str) -> int:
    return compare.main([*FAKE, "--landscape", str(landscape), "--strategies", STRATEGIES, "--seeds", "3",
                         "--budget", "24", "--runtime", "local", "--out", str(out), "--quiet", *extra])


@pytest.fixture(scope="module")
def comparison(landscape: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cmp") / "a"
    assert run_compare(out, landscape) == 0
    return out


def test_five_strategies_three_seeds(comparison: Path) -> None:
    manifest = json.loads((comparison / "comparison.json").read_text())
    assert manifest["strategies"] == ["evolutionary", "map_elites", "random", "greedy", "optuna"]
    assert len(manifest["outcomes"]) == 15 and manifest["unseen"] == 0
    assert manifest["landscape"]["records"] == 60 and manifest["landscape"]["grid_points"] == 60
    frame = pd.read_parquet(comparison / "evaluations.parquet")
    assert list(frame.columns[:4]) == ["strategy", "seed", "index", "generation"]
    counts = frame.groupby(["strategy", "seed"]).size()
    assert len(counts) == 15 and (counts <= 24).all()
    assert (counts[["evolutionary", "map_elites", "random", "optuna"]] == 24).all()  # greedy may stall early
    for _, run in frame.groupby(["strategy", "seed"]):
        assert run["best_so_far"].is_monotonic_increasing
        assert list(run["index"]) == list(range(1, len(run) + 1))
    assert (frame["status"] != "SKIPPED").all()
    for name in ("trajectory", "to_target", "operators", "lineage"):
        assert (comparison / "report" / f"{name}.png").stat().st_size > 10_000
    assert (comparison / "runs" / "greedy-s2" / "journal.jsonl").is_file()
    assert "Evaluations to reach the target" in (comparison / "report" / "summary.md").read_text()


def test_rerun_gives_identical_numbers(comparison: Path, landscape: Path, tmp_path: Path) -> None:
    assert run_compare(tmp_path / "b", landscape) == 0
    assert (comparison / "evaluations.csv").read_text() == (tmp_path / "b" / "evaluations.csv").read_text()
    for name in ("strategies", "to_target", "pairwise_to_target", "pairwise_final_best", "operators",
                 "lineage", "trajectory"):
        assert (comparison / "report" / f"{name}.csv").read_text() == \
            (tmp_path / "b" / "report" / f"{name}.csv").read_text(), name


@pytest.mark.ray
def test_ray_runtime_matches_local(comparison: Path, landscape: Path, tmp_path: Path) -> None:
    out = tmp_path / "ray"
    code = compare.main([*FAKE, "--landscape", str(landscape), "--strategies", STRATEGIES, "--seeds", "3",
                         "--budget", "24", "--out", str(out), "--quiet", "--no-report", "--parallel", "2"])
    assert code == 0
    assert (out / "evaluations.csv").read_text() == (comparison / "evaluations.csv").read_text()


def test_landscape_restricts_the_seed_space(landscape: Path) -> None:
    (seed,) = Landscape.load(landscape).seeds(FakeWorkload().seeds())
    assert seed.name == "fake_a"
    assert seed.launch_space["THREADS"].choices == (128,)  # only the recorded value
    assert seed.knob_space["TILE"].choices == (16, 32, 64, 128, 256)
    assert seed.id in {c.id for c in Landscape.load(landscape).replay.candidates()}


def test_an_xz_landscape_is_the_same_landscape(landscape: Path, tmp_path: Path) -> None:
    folder = tmp_path / "workload" / "landscapes"
    folder.mkdir(parents=True)
    packed = folder / "fake_a.jsonl.xz"
    packed.write_bytes(lzma.compress(landscape.read_bytes()))
    assert default_landscape(tmp_path / "workload") == packed
    plain, xz = Landscape.load(landscape), Landscape.load(packed)
    assert len(xz) == len(plain) and xz.shapes == plain.shapes
    assert [s.id for s in xz.seeds(FakeWorkload().seeds())] == [s.id for s in plain.seeds(FakeWorkload().seeds())]
    (folder / "other.jsonl").write_bytes(landscape.read_bytes())
    with pytest.raises(LandscapeError, match="several landscapes"):
        default_landscape(tmp_path / "workload")


def test_the_space_size_counts_only_valid_points() -> None:
    seed = FakeWorkload().seeds()[0]
    plain = valid_points(seed)
    assert plain == math.prod(len(p.choices) for p in seed.space.values())
    ruled = seed.model_copy(update={"constraints": ("TILE != 16",)})
    assert valid_points(ruled) == plain // len(seed.knob_space["TILE"].choices) * 4


def test_partial_landscape_counts_unseen(tmp_path: Path) -> None:
    path = fake_landscape(tmp_path / "part.jsonl", keep=30)
    out = tmp_path / "out"
    code = compare.main([*FAKE, "--landscape", str(path), "--strategies", "random", "--seeds", "2",
                         "--budget", "20", "--runtime", "local", "--out", str(out), "--quiet", "--no-report"])
    assert code == 0
    manifest = json.loads((out / "comparison.json").read_text())
    frame = pd.read_csv(out / "evaluations.csv")
    skipped = int((frame["status"] == "SKIPPED").sum())
    assert manifest["unseen"] == skipped > 0  # never invented, always counted


def test_gpu_seconds_budget_charges_recorded_device_time(landscape: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    code = compare.main([*FAKE, "--landscape", str(landscape), "--strategies", "random,greedy", "--seeds", "2",
                         "--gpu-seconds", "5", "--runtime", "local", "--out", str(out), "--quiet"])
    assert code == 0
    manifest = json.loads((out / "comparison.json").read_text())
    assert manifest["budget"]["unit"] == "device_s"
    for o in manifest["outcomes"]:  # the fake records 0.5 s each; the last batch (8) may overshoot
        assert 5.0 <= o["device_s"] < 5.0 + 8 * 0.5 or o["stop_reason"] != "budget spent"
    reach = pd.read_csv(out / "report" / "to_target.csv")
    assert (reach["evaluations"] <= 10).all()  # only what was spent within the 5 s counts
    assert "device seconds to reach the target" in (out / "report" / "summary.md").read_text().lower()


@pytest.mark.parametrize(("args", "message"), [
    (["--strategies", "ga,annealing"], "unknown strategy 'annealing'"),
    (["--strategies", ","], "--strategies is empty"),
    (["--seeds", "0"], "need at least one seed"),
    (["--seeds", "x"], "expected N or a comma-separated list"),
    (["--seeds", "1,1"], "distinct"),
    (["--budget", "0"], "must be at least 1"),
    (["--gpu-seconds", "-1"], "must be positive"),
    (["--target-fraction", "1.5"], "(0, 1]"),
    (["--parallel", "0"], "must be at least 1"),
    (["--set", "nonsense.key=1"], "unknown key"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, landscape: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = [*FAKE, "--landscape", str(landscape), "--budget", "5", "--runtime", "local",
            "--out", str(tmp_path / "o"), "--quiet"]
    assert compare.main([*base, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evokernel.compare: error:") and message in err and "\n" not in err


def test_bad_files_are_one_line_errors(landscape: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--budget", "5", "--runtime", "local", "--quiet"]
    assert compare.main([*FAKE, "--landscape", str(tmp_path / "none.jsonl"), *common]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"candidate": 1}\n')
    assert compare.main([*FAKE, "--landscape", str(bad), *common]) == 2
    assert "not a landscape record" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert compare.main([*FAKE, "--landscape", str(landscape), "--out", str(tmp_path / "full"), *common]) == 2
    assert "not empty" in capsys.readouterr().err
    assert compare.main(["--workload", "no_such_workload", "--landscape", str(landscape), *common]) == 2
    assert "no_such_workload" in capsys.readouterr().err
    assert compare.main([*FAKE, "--landscape", str(landscape), "--runtime", "local", "--quiet"]) == 2
    assert "give a budget" in capsys.readouterr().err


def test_restricted_values_keep_a_full_grid_unseen_free(tmp_path: Path) -> None:
    seed = FakeWorkload().seeds()[0]
    kept = [c for c in grid(seed) if c.params["TILE"] in (32, 64) and c.params["ALGO"] != "broken"]
    path = tmp_path / "sub.jsonl"
    record_grid(kept, FakeEvaluator(), ["s0"], path)
    (restricted,) = Landscape.load(path).seeds(FakeWorkload().seeds())
    assert restricted.knob_space["TILE"].choices == (32, 64)
    assert restricted.knob_space["ALGO"].choices == ("radix", "bitonic")
    assert restricted.id == seed.id  # defaults were recorded: same content, same id
    out = tmp_path / "out"
    assert compare.main([*FAKE, "--landscape", str(path), "--strategies", "ga,random", "--seeds", "2",
                         "--budget", "12", "--runtime", "local", "--out", str(out), "--quiet", "--no-report"]) == 0
    assert json.loads((out / "comparison.json").read_text())["unseen"] == 0


def test_landscape_of_unknown_code_searches_from_its_own_candidate(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from evokernel.testing import fake_candidate

    path = tmp_path / "other.jsonl"
    record_grid(grid(fake_candidate("other", 3.0)), FakeEvaluator(), ["s0"], path)
    out = tmp_path / "out"
    assert compare.main([*FAKE, "--landscape", str(path), "--strategies", "greedy", "--seeds", "1",
                         "--budget", "8", "--runtime", "local", "--out", str(out), "--quiet", "--no-report"]) == 0
    assert "no seed of fake has the code" in capsys.readouterr().err
    manifest = json.loads((out / "comparison.json").read_text())
    assert manifest["landscape"]["seeds"][0]["from_workload"] is False and manifest["unseen"] == 0


def test_live_evaluator_without_landscape(tmp_path: Path) -> None:
    out = tmp_path / "live"
    code = compare.main([*FAKE, "--set", "evaluator.factory=evokernel.testing:FakeEvaluator", "--strategies",
                         "random,greedy", "--seeds", "2", "--budget", "10", "--runtime", "local", "--out", str(out),
                         "--quiet"])
    assert code == 0
    manifest = json.loads((out / "comparison.json").read_text())
    assert manifest["landscape"] is None and len(manifest["seed_candidates"]) == 3
    assert "the best fitness seen in any run" in (out / "report" / "summary.md").read_text()
