"""The engine loop: budget accounting, the evaluation cache, determinism and resume."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from evokernel.candidate import Candidate
from evokernel.engine import Budget, EnvironmentChanged
from evokernel.evaluate.result import Evaluation
from evokernel.runtime import LocalRuntime
from evokernel.testing import FakeEvaluator, fake_engine

WALL_CLOCK = ("time",)


def decisions(run_dir: Path) -> list[dict[str, Any]]:
    """The journal without wall-clock fields."""
    out = []
    for line in (run_dir / "journal.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for key in WALL_CLOCK:
            rec.pop(key)
        rec["evaluation"].pop("wall_s")
        out.append(rec)
    return out


@pytest.mark.parametrize("name", ["evolutionary", "random", "greedy", "optuna"])
def test_same_seed_same_journal(tmp_path: Path, name: str) -> None:
    for d in ("a", "b"):
        fake_engine(tmp_path / d, name, budget=18, seed=11).run()
    assert decisions(tmp_path / "a") == decisions(tmp_path / "b")
    fake_engine(tmp_path / "c", name, budget=18, seed=12).run()
    assert decisions(tmp_path / "a") != decisions(tmp_path / "c")


class Interrupt(Exception):
    pass


class DyingRuntime(LocalRuntime):
    """Stops the process (by raising) after ``after`` evaluations, like a kill."""

    def __init__(self, after: int) -> None:
        super().__init__(FakeEvaluator)
        self.left = after

    def evaluate(self, candidates: Sequence[Candidate], shapes: Sequence[str]) -> Iterator[tuple[int, Evaluation]]:
        for item in super().evaluate(candidates, shapes):
            if self.left == 0:
                raise Interrupt
            self.left -= 1
            yield item


@pytest.mark.parametrize("name", ["evolutionary", "random", "greedy", "optuna"])
@pytest.mark.parametrize("after", [2, 5, 13])
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path: Path, name: str, after: int) -> None:
    full = fake_engine(tmp_path / "full", name, budget=22, seed=4)
    full.run()
    part = fake_engine(tmp_path / "cut", name, budget=22, seed=4, runtime=DyingRuntime(after))
    with pytest.raises(Interrupt):
        part.run()
    resumed = fake_engine(tmp_path / "cut", name, budget=22, seed=4, resume=True)
    resumed.run()
    assert resumed.strategy.state() == full.strategy.state()
    assert resumed.state.spent == full.state.spent
    # Same evaluations in the same order (in-flight work is redone, never duplicated).
    assert [r["id"] for r in decisions(tmp_path / "cut")] == [r["id"] for r in decisions(tmp_path / "full")]


def test_repeated_candidates_cost_nothing_but_are_told(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "run", "random", budget=10)
    told: list[str] = []
    original = engine.strategy.tell

    def spy(c: Candidate, e: Evaluation) -> None:
        told.append(c.id)
        original(c, e)

    engine.strategy.tell = spy  # type: ignore[method-assign]
    seeds = engine.seeds
    engine._generation(0, seeds)
    spent = engine.state.spent.evaluations
    engine._generation(1, [seeds[0], seeds[0], seeds[1]])
    assert engine.state.spent.evaluations == spent == len(seeds)
    assert told[-3:] == [seeds[0].id, seeds[0].id, seeds[1].id]
    assert len(engine.run_dir.records()) == len(seeds)


def test_device_second_budget(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "run", "random", budget=1000)
    engine.budget = Budget(device_s=3.0)
    assert engine.run() == "budget spent"
    assert engine.state.spent.device_s >= 3.0
    assert engine.state.spent.device_s - 3.0 < 0.5 * engine.batch_size


def test_stall_stops_a_run_that_proposes_nothing_new(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "run", "greedy", budget=10_000)
    engine.max_stall = 3
    reason = engine.run()
    assert "no new candidate" in reason  # the fake space is finite


def test_environment_change_is_refused_unless_allowed(tmp_path: Path) -> None:
    fake_engine(tmp_path / "run", "random", budget=8).run()
    before = (tmp_path / "run" / "run.json").read_text()
    other = {"gpu": "another-gpu", "driver": "1", "torch": "0", "cuda": "0"}
    with pytest.raises(EnvironmentChanged, match="gpu: 'fake-gpu' -> 'another-gpu'"):
        fake_engine(tmp_path / "run", "random", budget=12, resume=True, environment=other)
    assert (tmp_path / "run" / "run.json").read_text() == before
    engine = fake_engine(tmp_path / "run", "random", budget=12, resume=True, environment=other,
                         allow_env_change=True)
    engine.run()
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["environment"]["gpu"] == "another-gpu"
    assert manifest["environment_history"][0]["environment"]["gpu"] == "fake-gpu"
