"""Runtimes: the local one in process, the Ray one with island and evaluator actors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from evokernel.evaluate.result import Status
from evokernel.registry import load_object
from evokernel.runtime import LocalRuntime, RayRuntime, evaluator_factory
from evokernel.testing import FakeEvaluator, fake_candidate, fake_engine


def test_local_runtime_turns_an_evaluator_exception_into_one_failed_evaluation() -> None:
    rt = LocalRuntime(lambda: FakeEvaluator(raise_on={"TILE": 64}))
    cands = [fake_candidate(TILE=t) for t in (32, 64, 128)]
    out = dict(rt.evaluate(cands, ["s0"]))
    assert out[1].status is Status.RUNTIME_ERROR and "broke" in out[1].feedback
    assert out[0].status is Status.PASSED and out[2].status is Status.PASSED


@pytest.mark.parametrize("concurrent", [1, 2])
def test_local_runtime_keeps_as_many_calls_in_flight_as_the_evaluator_takes(concurrent: int) -> None:
    evaluator = FakeEvaluator(delay_s=0.05, concurrent=concurrent)
    rt = LocalRuntime(lambda: evaluator)
    cands = [fake_candidate(TILE=t) for t in (16, 32, 64, 128, 256)]
    out = dict(rt.evaluate(cands, ["s0"]))
    assert sorted(out) == [0, 1, 2, 3, 4]
    assert [out[i].candidate_id for i in range(5)] == [c.id for c in cands]
    assert evaluator.peak_in_flight() == concurrent


def test_local_engine_with_a_concurrent_evaluator_matches_the_serial_run(tmp_path: Path) -> None:
    """Results arriving in any order: the same candidates and strategy state."""
    serial = fake_engine(tmp_path / "serial", "evolutionary", budget=24, seed=3, pipeline=True)
    serial.run()
    both = fake_engine(tmp_path / "both", "evolutionary", budget=24, seed=3, pipeline=True,
                       delay_s=0.05, delay_jitter=0.5, concurrent=2)
    both.run()
    assert both.runtime.evaluator.peak_in_flight() == 2  # type: ignore[attr-defined]
    assert both.strategy.state() == serial.strategy.state()
    assert sorted(ids(tmp_path / "both")) == sorted(ids(tmp_path / "serial"))


@pytest.mark.parametrize("fails", [False, True])
def test_local_runtime_warms_the_evaluator_up_once_per_shapes_before_it_evaluates(
        fails: bool, caplog: pytest.LogCaptureFixture) -> None:
    evaluator = FakeEvaluator(warm_up_fails=fails)
    rt = LocalRuntime(lambda: evaluator)
    cands = [fake_candidate(TILE=t) for t in (32, 64)]
    with caplog.at_level("WARNING"):
        dict(rt.evaluate(cands, ["s0", "s1"]))
        dict(rt.evaluate(cands, ["s0", "s1"]))
        dict(rt.evaluate(cands, ["s1"]))
    assert evaluator.warmed == [(["s0", "s1"], 0), (["s1"], 4)]
    assert ("warm-up failed" in caplog.text) is fails
    assert evaluator.calls == 6  # a failed warm-up costs no evaluation


def test_factories_load_by_import_path() -> None:
    factory = evaluator_factory("evokernel.testing:FakeEvaluator", "fake", {"device_s": 2.0})
    assert factory().device_s == 2.0  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="form"):
        load_object("no_colon")
    with pytest.raises(ValueError, match="cannot load"):
        load_object("evokernel.testing:Nope")


def ids(run: Path) -> list[str]:
    return [json.loads(x)["id"] for x in (run / "journal.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}},
             log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_ray_islands_and_evaluator_actors_match_the_local_run(tmp_path: Path, ray_session: None) -> None:
    import ray

    local = fake_engine(tmp_path / "local", "evolutionary", budget=20, seed=2)
    local.run()
    rt = RayRuntime(FakeEvaluator, evaluators=1)
    try:
        remote = fake_engine(tmp_path / "ray", "evolutionary", budget=20, seed=2, runtime=rt)
        assert len(rt._actors) == 1 and len(rt._populations) == 2  # 1 evaluator, 2 islands
        remote.run()
        assert all(isinstance(a, ray.actor.ActorHandle) for a in rt._populations + rt._actors)
        assert all(ray.get(a.call.remote("__len__")) > 0 for a in rt._populations)  # islands hold data
        assert rt.fingerprint() == FakeEvaluator().environment()
        assert ids(tmp_path / "ray") == ids(tmp_path / "local")
        assert remote.strategy.state() == local.strategy.state()
        # resume through fresh island actors, rebuilt from the snapshot
        resumed = fake_engine(tmp_path / "ray", "evolutionary", budget=26, seed=2, runtime=rt, resume=True)
        assert len(rt._populations) == 4
        resumed.run()
        assert len(ids(tmp_path / "ray")) == 26
    finally:
        rt.close()


@pytest.mark.ray
@pytest.mark.slow
def test_ray_evaluator_actor_that_dies_costs_one_evaluation(ray_session: None) -> None:
    rt = RayRuntime(lambda: FakeEvaluator(exit_on={"TILE": 64}), evaluators=1)
    try:
        cands = [fake_candidate(TILE=t) for t in (32, 64, 128)]
        out = dict(rt.evaluate(cands, ["s0"]))
        assert out[1].status is Status.RUNTIME_ERROR and "crashed" in out[1].feedback
        assert out[0].status is Status.PASSED and out[2].status is Status.PASSED  # a new actor took over
        # the new actor was warmed up before it evaluated, as the first was
        assert rt._ray.get(rt._actors[0].call.remote("warm_ups")) == [(["s0"], 0)]
    finally:
        rt.close()


@pytest.mark.ray
def test_ray_evaluator_actors_are_warmed_up_once_per_shapes_before_they_evaluate(ray_session: None) -> None:
    rt = RayRuntime(lambda: FakeEvaluator(), evaluators=2)
    try:
        cands = [fake_candidate(TILE=t) for t in (16, 32, 64, 128)]
        dict(rt.evaluate(cands, ["s0"]))
        dict(rt.evaluate(cands, ["s0"]))
        for actor in rt._actors:
            assert rt._ray.get(actor.call.remote("warm_ups")) == [(["s0"], 0)]
    finally:
        rt.close()


@pytest.mark.ray
@pytest.mark.slow
def test_pipelined_generations_do_not_depend_on_timing(tmp_path: Path, ray_session: None) -> None:
    """Two evaluators finishing in any order: the same candidates and strategy state as in process."""
    local = fake_engine(tmp_path / "local", "evolutionary", budget=24, seed=3, pipeline=True)
    local.run()
    rt = RayRuntime(lambda: FakeEvaluator(delay_s=0.05, delay_jitter=0.9), evaluators=2)
    try:
        remote = fake_engine(tmp_path / "ray", "evolutionary", budget=24, seed=3, runtime=rt, pipeline=True)
        remote.run()
        assert remote.strategy.state() == local.strategy.state()  # islands live in actors: before close
    finally:
        rt.close()
    assert sorted(ids(tmp_path / "ray")) == sorted(ids(tmp_path / "local"))
    assert remote.state.spent.evaluations == local.state.spent.evaluations == 24


@pytest.mark.ray
@pytest.mark.slow
def test_ray_evaluator_actor_takes_the_calls_its_evaluator_takes_at_once(ray_session: None) -> None:
    import ray

    rt = RayRuntime(lambda: FakeEvaluator(delay_s=0.3, concurrent=2), evaluators=1)
    try:
        assert rt._in_flight == [2]
        cands = [fake_candidate(TILE=t) for t in (16, 32, 64, 128)]
        out = dict(rt.evaluate(cands, ["s0"]))
        assert sorted(out) == [0, 1, 2, 3] and all(e.status is Status.PASSED for e in out.values())
        assert ray.get(rt._actors[0].call.remote("peak_in_flight")) == 2
    finally:
        rt.close()
