"""The comparison overview: per-strategy bands over seeds, from the runs' journals."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from evokernel.dashboard.comparison_view import ComparisonView
from evokernel.journal import RunDir

from .conftest import copy_run, tree_fingerprint


def best_so_far(run: Path) -> list[float]:
    out, best = [], 0.0
    for r in RunDir.open(run).records():
        best = max(best, r.evaluation.fitness or 0.0)
        out.append(best)
    return out


def test_bands_are_median_min_and_max_over_the_seeds(comparison: Path) -> None:
    state = ComparisonView(comparison).state()
    manifest = json.loads((comparison / "comparison.json").read_text())
    assert state["finished"] and state["strategies"] == manifest["strategies"]
    assert {r["key"] for r in state["runs"]} == {r["dir"] for r in manifest["runs"]}
    assert all(r["state"] == "done" for r in state["runs"])
    for strategy in manifest["strategies"]:
        curves = [best_so_far(comparison / r["dir"]) for r in manifest["runs"] if r["strategy"] == strategy]
        band = state["bands"][strategy]
        for i, x in enumerate(band["x"]):
            at = [c[i] for c in curves if len(c) > i]
            assert x == i + 1 and band["seeds"][i] == len(at)
            assert band["median"][i] == statistics.median(at)
            assert (band["low"][i], band["high"][i]) == (min(at), max(at))
        device = state["bands_device"][strategy]
        assert device["x"][0] == 0.0 and device["seeds"] == [len(curves)] * len(device["x"])  # all finished
        finals = [c[-1] for c in curves]
        assert device["median"][-1] == statistics.median(finals)
        assert (device["low"][-1], device["high"][-1]) == (min(finals), max(finals))


def test_a_comparison_that_has_just_started_shows_waiting_runs(comparison: Path, tmp_path: Path) -> None:
    root = copy_run(comparison, tmp_path)
    manifest = json.loads((root / "comparison.json").read_text())
    del manifest["outcomes"]
    (root / "comparison.json").write_text(json.dumps(manifest))
    waiting = manifest["runs"][-1]["dir"]
    for p in sorted((root / waiting).rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (root / waiting).rmdir()
    state = ComparisonView(root).state()
    assert not state["finished"]
    states = {r["key"]: r["state"] for r in state["runs"]}
    assert states[waiting] == "waiting" and list(states.values()).count("running") == len(states) - 1
    assert not state["notices"]  # a run that has not started is not a problem
    strategy = manifest["runs"][-1]["strategy"]
    running = sum(r["strategy"] == strategy for r in manifest["runs"]) - 1
    assert max(state["bands"][strategy]["seeds"]) == running  # the waiting run counts nowhere
    # a run still going counts only as far as it has got
    lengths = [len(best_so_far(root / r["dir"])) for r in manifest["runs"][:-1] if r["strategy"] == strategy]
    assert state["bands"][strategy]["seeds"][-1] == sum(n == max(lengths) for n in lengths)


def test_a_half_written_manifest_keeps_what_was_read(comparison: Path, tmp_path: Path) -> None:
    root = copy_run(comparison, tmp_path)
    view = ComparisonView(root)
    runs = len(view.state()["runs"])
    (root / "comparison.json").write_text('{"format": 1, "runs": [')
    view.refresh()
    state = view.state()
    assert len(state["runs"]) == runs
    assert any("comparison.json is half-written" in n for n in state["notices"])


def test_a_run_directory_outside_the_folder_is_not_followed(comparison: Path, tmp_path: Path) -> None:
    root = copy_run(comparison, tmp_path)
    manifest = json.loads((root / "comparison.json").read_text())
    manifest["runs"].append({"strategy": "x", "seed": 9, "dir": "../../elsewhere"})
    (root / "comparison.json").write_text(json.dumps(manifest))
    assert "../../elsewhere" not in {r["key"] for r in ComparisonView(root).state()["runs"]}


def test_reading_a_comparison_changes_nothing(comparison: Path) -> None:
    before = tree_fingerprint(comparison)
    ComparisonView(comparison).refresh()
    assert tree_fingerprint(comparison) == before
