"""search_improvement names each side's median evaluation, a failure stands for all, and a
search that finds nothing better is recorded all the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import search_improvement
from benchmarks.search_improvement import median_evaluation
from tests.test_finalists import verdict


def test_the_median_evaluation_is_the_middle_one() -> None:
    rounds = [verdict("a", 5.0), verdict("a", 9.0), verdict("a", 6.0)]
    assert median_evaluation(rounds).fitness == rounds[2].fitness
    assert median_evaluation(rounds[:2]).fitness == rounds[0].fitness  # even: the lower middle


def test_a_failed_round_stands_for_all() -> None:
    rounds = [verdict("a", 5.0), verdict("a", None), verdict("a", 6.0)]
    assert median_evaluation(rounds).fitness is None


def test_a_search_that_finds_nothing_better_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU only the torch seed is timed, so the best found is the seed: the run is
    still written down (its evaluations, its finalists, best_found None) and exits 0."""
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["search_improvement.py", "--workload", "dsa_topk", "--budget", "2",
                                      "--gpu-seconds", "5", "--runtime", "local", "--finalists", "1"])
    assert search_improvement.main() == 0
    (record,) = tmp_path.glob("search-dsa_topk-cpu-*.json")
    metrics = json.loads(record.read_text())["metrics"]["search"]
    assert metrics["best_found"] is None and metrics["evaluations"] >= 1
    assert metrics["confirmed_gain_quick"] == 1.0 and metrics["finalists"][0]["seed"] is True
    assert metrics["complete"] is True and record.name.startswith("search-dsa_topk-cpu-")
    assert [p.name for p in tmp_path.glob("*.json")] == [record.name], "the early record was replaced"
    assert (tmp_path / "search-dsa_topk-summary.md").read_text().strip()
    assert not (tmp_path / "best_candidate.json").exists()
