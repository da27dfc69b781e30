"""The engine loop: budget accounting, the evaluation cache, determinism and resume."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evokernel.candidate import Candidate
from evokernel.engine import Budget, EnvironmentChanged
from evokernel.evaluate.result import Evaluation
from evokernel.runtime import LocalRuntime, Work
from evokernel.strategies import Strategy, StrategyEnv
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

    def evaluate_stream(self, work: Work, shapes: Sequence[str]) -> Iterator[tuple[Any, Evaluation]]:
        for item in super().evaluate_stream(work, shapes):
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


class Scripted(Strategy):
    """Asks the given batches, then nothing."""

    name = "scripted"

    def __init__(self, env: StrategyEnv, batches: list[list[Candidate]]) -> None:
        super().__init__(env)
        self.batches = batches
        self.told: list[str] = []

    def ask(self, n: int) -> list[Candidate]:
        return self.batches.pop(0) if self.batches else []

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        super().tell(candidate, evaluation)
        self.told.append(candidate.id)


def test_repeated_candidates_cost_nothing_but_are_told(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "run", "random", budget=10)
    seeds = engine.seeds
    engine.strategy = scripted = Scripted(engine.strategy.env, [[seeds[0], seeds[0], seeds[1]]])
    engine.max_stall = 2
    assert engine.run() == "no new candidate in 2 generations"
    assert engine.state.spent.evaluations == len(seeds) and len(engine.run_dir.records()) == len(seeds)
    assert scripted.told == [s.id for s in seeds] + [seeds[0].id, seeds[0].id, seeds[1].id]


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


# -- one loop, exact at every kill point, whatever the arrival order -----------------------------

def kill_at(monkeypatch: pytest.MonkeyPatch, where: str, k: int) -> None:
    """Raise ``Interrupt`` at the ``k``-th call of a step, before or after it did its work."""
    from evokernel.journal import RunDir

    owner, name, when = {
        "append": (RunDir, "append", "after"),  # an evaluation journaled, not yet told
        "snapshot-before": (RunDir, "write_snapshot", "before"),  # a generation told, not snapshotted
        "snapshot-after": (RunDir, "write_snapshot", "after"),  # snapshotted, next not yet asked
        "ask": (Strategy, "on_budget", "after"),  # about to ask
    }[where]
    original = getattr(owner, name)
    calls = [0]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == k and when == "before":
            raise Interrupt
        out = original(self, *args, **kwargs)
        if calls[0] == k:
            raise Interrupt
        return out

    monkeypatch.setattr(owner, name, step)


def final(engine: Any) -> tuple[Any, Any]:
    return engine.strategy.state(), engine.state.spent


@pytest.mark.parametrize(("name", "pipeline", "options"), [
    ("evolutionary", True, {}), ("evolutionary", True, {"tune_trials": 3}), ("greedy", True, {}),
    ("optuna", True, {}), ("random", False, {}),
])
@pytest.mark.parametrize("where", ["append", "snapshot-before", "snapshot-after", "ask"])
def test_exact_at_every_kill_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, pipeline: bool,
                                   options: dict[str, Any], where: str) -> None:
    """Killed at each point of each kind in turn (k = 1, 2, ... until the run ends first),
    then resumed: the same journal and the same final strategy state as never killed."""
    whole = fake_engine(tmp_path / "whole", name, budget=22, seed=4, pipeline=pipeline, options=options)
    whole.run()
    expected, journal = final(whole), [r["id"] for r in decisions(tmp_path / "whole")]
    k = 1
    while True:
        run = tmp_path / f"{where}-{k}"
        with monkeypatch.context() as m:
            kill_at(m, where, k)
            try:
                fake_engine(run, name, budget=22, seed=4, pipeline=pipeline, options=options).run()
                break  # the run ended before the k-th such point: every point was tried
            except Interrupt:
                pass
        resumed = fake_engine(run, name, budget=22, seed=4, resume=True)
        resumed.run()
        assert final(resumed) == expected, f"killed at {where} #{k}"
        assert [r["id"] for r in decisions(run)] == journal, f"killed at {where} #{k}"
        k += 1
    assert k > 3


class ShuffledRuntime(LocalRuntime):
    """``width`` evaluators whose results come back in a random order: up to ``width``
    candidates are taken from the queue, then returned shuffled."""

    def __init__(self, width: int, seed: int) -> None:
        super().__init__(FakeEvaluator)
        self.width = width
        self.rng = np.random.default_rng(seed)

    def evaluate_stream(self, work: Work, shapes: Sequence[str]) -> Iterator[tuple[Any, Evaluation]]:
        running: list[tuple[Any, Candidate]] = []
        while work or running:
            while work and len(running) < self.width:
                running.append(work.popleft())
            tag, cand = running.pop(int(self.rng.integers(len(running))))
            yield tag, self.evaluator.evaluate(cand, shapes)


@pytest.mark.parametrize("name", ["evolutionary", "greedy"])
def test_the_order_results_arrive_in_changes_no_decision(tmp_path: Path, name: str) -> None:
    fifo = fake_engine(tmp_path / "fifo", name, budget=30, seed=2, batch_size=6, pipeline=True)
    fifo.run()
    ids = sorted(r["id"] for r in decisions(tmp_path / "fifo"))
    for seed in range(3):
        shuffled = fake_engine(tmp_path / f"s{seed}", name, budget=30, seed=2, batch_size=6, pipeline=True,
                               runtime=ShuffledRuntime(4, seed))
        shuffled.run()
        assert final(shuffled) == final(fifo)
        assert sorted(r["id"] for r in decisions(tmp_path / f"s{seed}")) == ids
    assert [r["id"] for r in decisions(tmp_path / "s0")] != [r["id"] for r in decisions(tmp_path / "fifo")]


def test_barrier_and_pipelined_differ_only_in_how_far_ask_runs_ahead(tmp_path: Path) -> None:
    barrier = fake_engine(tmp_path / "b", "evolutionary", budget=30, seed=1)
    barrier.run()
    pipelined = fake_engine(tmp_path / "p", "evolutionary", budget=30, seed=1, pipeline=True)
    asked: list[int] = []
    original = pipelined.strategy.ask

    def ask(n: int) -> list[Candidate]:
        asked.append(pipelined.state.generation)  # the last generation told when asked
        return original(n)

    pipelined.strategy.ask = ask  # type: ignore[method-assign]
    pipelined.run()
    assert asked[:2] == [0, 0]  # generations 1 and 2 both asked once the seeds were told
    assert all(told == g - 2 for g, told in enumerate(asked[2:], start=3))  # then g once g - 2 was
    assert len(decisions(tmp_path / "p")) == len(decisions(tmp_path / "b")) == 30
