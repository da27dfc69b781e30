"""Every strategy under the same engine loop and budget; state round trips are exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from evokernel.evaluate.result import Status
from evokernel.strategies import (
    STRATEGIES,
    Strategy,
    StrategyEnv,
    make_strategy,
    strategy_from_state,
)
from evokernel.testing import FakeEvaluator, FakeWorkload, fake_engine

NAMES = sorted(STRATEGIES)


@pytest.mark.parametrize("name", NAMES)
def test_each_strategy_spends_exactly_the_budget(tmp_path: Path, name: str) -> None:
    engine = fake_engine(tmp_path / "run", name, budget=20)
    assert isinstance(engine.strategy, Strategy)
    assert engine.run() == "budget spent"
    records = engine.run_dir.records()
    assert len(records) == engine.state.spent.evaluations == 20
    assert len({r.candidate_id for r in records}) == 20  # the cache means no id is paid twice
    best = engine.ranked()[0][1]
    assert best.status is Status.PASSED
    seeds_best = max(FakeEvaluator().evaluate(s, ["s0"]).fitness or 0 for s in FakeWorkload().seeds())
    assert best.fitness is not None and best.fitness >= seeds_best


@pytest.mark.parametrize("name", NAMES)
def test_skipped_candidates_are_no_fitness_not_a_crash(tmp_path: Path, name: str) -> None:
    engine = fake_engine(tmp_path / "run", name, budget=12)
    engine.run()
    statuses = {r.evaluation.status for r in engine.run_dir.records()}
    assert Status.SKIPPED in statuses  # the CUDA seed on a machine without a GPU


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trip_continues_identically(tmp_path: Path, name: str) -> None:
    seeds = FakeWorkload().seeds()
    ev = FakeEvaluator()
    env = StrategyEnv(seeds, 3, "fake", run_dir=tmp_path)
    a = make_strategy(name, env)
    for s in seeds:
        a.tell(s, ev.evaluate(s, ["s0"]))
    for _ in range(3):
        for c in a.ask(4):
            a.tell(c, ev.evaluate(c, ["s0"]))
    b = strategy_from_state(a.state(), StrategyEnv(seeds, 3, "fake", run_dir=tmp_path / "b"))
    assert b.state() == a.state()
    for _ in range(3):
        ca, cb = a.ask(4), b.ask(4)
        assert [c.id for c in ca] == [c.id for c in cb]
        for x, y in zip(ca, cb, strict=True):
            a.tell(x, ev.evaluate(x, ["s0"]))
            b.tell(y, ev.evaluate(y, ["s0"]))
    assert a.state() == b.state()


def test_evolutionary_with_map_elites_islands_and_launch_tuning(tmp_path: Path) -> None:
    from evokernel.config import PopulationConfig

    axes = PopulationConfig().axes
    engine = fake_engine(
        tmp_path / "run", "evolutionary", budget=30,
        options={"island_kind": "map_elites", "axes": axes, "tune_trials": 4, "mutate_launch": False},
    )
    engine.run()
    ops = {r.candidate["operator"] for r in engine.run_dir.records()}
    assert "optuna_launch" in ops
    assert list((tmp_path / "run" / "optuna").glob("tune-*.log"))
    state = engine.strategy.state()
    assert state["islands"]["islands"][0]["kind"] == "map_elites"
    assert state["logbook"] and {"gen", "best", "mean"} <= set(state["logbook"][0])


def test_greedy_only_moves_on_improvement(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "run", "greedy", budget=16)
    engine.run()
    inc = engine.strategy.incumbent  # type: ignore[attr-defined]
    assert inc[1].rank_key() == engine.ranked()[0][1].rank_key()


def test_map_elites_is_evolution_over_map_elites_islands(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "run", "map_elites", budget=24)
    assert engine.run() == "budget spent"
    state = engine.strategy.state()
    assert state["strategy"] == "map_elites"
    assert {island["kind"] for island in state["islands"]["islands"]} == {"map_elites"}
    assert [a["name"] for a in state["options"]["axes"]] == ["registers", "shared_bytes"]
    env = StrategyEnv(FakeWorkload().seeds(), 0, "fake", run_dir=tmp_path / "b")
    with pytest.raises(ValueError, match="MAP-Elites islands"):
        make_strategy("map_elites", env, {"island_kind": "pool"})
