"""A strategy defined and registered here, outside evokernel, runs through search and
compare unchanged: one class plus one registration, no Literal or if-chain to edit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from evokernel import search
from evokernel.analysis import compare
from evokernel.candidate import Candidate, ParamValue
from evokernel.strategies import STRATEGIES, Strategy, StrategyEnv
from evokernel.testing import FakeEvaluator, FakeWorkload

REPO = Path(__file__).resolve().parents[2]
FAKE = str(REPO / "tests" / "fake_run.yaml")


class TileWalk(Strategy):
    """Walks each seed's TILE choices upward by ``step`` from the best told so far, picking
    UNROLL at random: enough state (an RNG, a cursor, the best) to show a resume."""

    name: ClassVar[str] = "tile_walk"

    def __init__(self, env: StrategyEnv, step: int = 1) -> None:
        super().__init__(env)
        self.step = step
        self.cursor = 0
        self.ended: list[int] = []

    def ask(self, n: int) -> list[Candidate]:
        self.generation += 1
        out = []
        for _ in range(n):
            seed = self.seeds[self.cursor % len(self.seeds)]
            tiles = seed.knob_space["TILE"].choices
            self.cursor += self.step
            knobs: dict[str, ParamValue] = {
                "TILE": tiles[self.cursor % len(tiles)],
                "UNROLL": seed.knob_space["UNROLL"].choices[int(self.rng.integers(4))],
            }
            out.append(seed.with_params(knobs=knobs, operator="tile_walk", generation=self.generation))
        return out

    def on_generation_end(self, generation: int) -> None:
        self.ended.append(generation)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "options": {"step": self.step}, "cursor": self.cursor, "ended": self.ended}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.cursor, self.ended = state["cursor"], list(state["ended"])


@pytest.fixture
def registered() -> Iterator[None]:
    STRATEGIES.register("tile_walk", TileWalk)
    yield
    STRATEGIES.unregister("tile_walk")


def journal(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]


def test_search_runs_and_resumes_a_registered_strategy(registered: None, tmp_path: Path) -> None:
    run, whole = tmp_path / "r", tmp_path / "whole"
    common = ["--config", FAKE, "--strategy", "tile_walk", "--set", "strategy_options.step=2", "--quiet"]
    assert search.main([*common, "--run-dir", str(whole), "--budget", "15"]) == 0
    assert search.main([*common, "--run-dir", str(run), "--budget", "7"]) == 0
    assert search.main(["--resume", str(run), "--budget", "15", "--quiet"]) == 0
    rows = journal(run)
    assert len(rows) == 15 and {r["candidate"]["operator"] for r in rows} == {"seed", "tile_walk"}
    assert [r["id"] for r in rows] == [r["id"] for r in journal(whole)]  # resumed exactly
    state = json.loads(sorted((run / "snapshots").glob("gen-*.json"))[-1].read_text())["strategy"]
    assert state["options"] == {"step": 2} and state["ended"] == list(range(state["generation"] + 1))
    assert "tile_walk" in (run / "summary.md").read_text()


def test_an_unknown_strategy_names_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert search.main(["--config", FAKE, "--strategy", "tile_wlak", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown strategy 'tile_wlak'" in err and "evolutionary" in err and "\n" not in err
    assert not (tmp_path / "r").exists()


def test_compare_runs_a_registered_strategy_beside_a_builtin(registered: None, tmp_path: Path) -> None:
    from evokernel.analysis.landscape import grid, record_grid

    landscape = tmp_path / "fake_a.jsonl"
    record_grid(grid(FakeWorkload().seeds()[0]), FakeEvaluator(), ["s0", "s1"], landscape)
    out = tmp_path / "cmp"
    code = compare.main(["--workload", "fake", "--set", "workload_loader=evokernel.testing:load_fake_workload",
                         "--landscape", str(landscape), "--strategies", "tile_walk,random", "--seeds", "2",
                         "--budget", "12", "--runtime", "local", "--out", str(out), "--quiet", "--no-report"])
    assert code == 0
    manifest = json.loads((out / "comparison.json").read_text())
    assert [o["strategy"] for o in manifest["outcomes"]] == ["tile_walk"] * 2 + ["random"] * 2
    assert all(o["evaluations"] == 12 for o in manifest["outcomes"])
    assert {r["candidate"]["operator"] for r in journal(out / "runs" / "tile_walk-s1")} == {"seed", "tile_walk"}


def test_a_strategy_named_by_import_path_needs_no_registration(tmp_path: Path) -> None:
    """The form a Ray worker or another process can resolve: ``module:Class``."""
    run = tmp_path / "r"
    out = subprocess.run(
        [sys.executable, "-m", "evokernel.search", "--quiet", "--config", FAKE, "--budget", "9",
         "--strategy", "tests.strategies.test_strategy_registry:TileWalk", "--run-dir", str(run)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert len(journal(run)) == 9 and journal(run)[-1]["candidate"]["operator"] == "tile_walk"
