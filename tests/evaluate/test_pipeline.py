"""Two evaluations in flight (``SandboxConfig.pipeline``), on the CPU: one candidate's
checks run while the next loads and makes its untimed calls; nothing is clocked beside
those checks, and no two candidates are judged at once."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from evokernel.candidate import Candidate, load_candidate
from evokernel.evaluate import concurrent_calls
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxEvaluator
from evokernel.runtime import LocalRuntime

from .redteam import (
    CANDIDATES,
    HONEST,
    check_follower,
    config_for,
    load_suite,
    planted_secrets,
    screen,
    slow_deaths,
)

SHAPES = ["30cecff1-7ea4-474b-90fc-7f4a87206d8e", "d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d"]
CHECKS_S = 1.5
"""How long each candidate's checks after its last shape are made to last."""


def copies(name: str, n: int) -> list[Candidate]:
    """``n`` candidates of the same code with distinct ids (a comment each)."""
    first = load_candidate(CANDIDATES / name, "dsa_topk")
    out = []
    for i in range(n):
        sources = {path: f"{text}\n# copy {i}\n" for path, text in first.sources.items()}
        out.append(first.model_copy(update={"sources": sources}))
    return out


class Trace:
    """When each evaluation's shapes were judged, its checks made, its code loaded, and
    what ran while the judge waited for quiet before a clocked batch."""

    def __init__(self, ev: SandboxEvaluator) -> None:
        self.lock = threading.Lock()
        self.shapes: list[tuple[int, float, float]] = []  # (thread, start, end)
        self.checks: list[tuple[int, float, float]] = []
        self.loads: list[tuple[int, float]] = []
        self.settling_at_quiet: list[int] = []
        judge_shape, settle, ask, quiet = ev.judge.judge_shape, ev.judge.settle, ev.judge.ask, ev._quiet

        def timed_shape(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                return judge_shape(*args, **kwargs)
            finally:
                self.add(self.shapes, (threading.get_ident(), start, time.monotonic()))

        def slow_settle(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            time.sleep(CHECKS_S)  # checks that take a while: the next candidate goes on
            try:
                return settle(*args, **kwargs)
            finally:
                self.add(self.checks, (threading.get_ident(), start, time.monotonic()))

        def recorded_ask(handle: Any, deadline: float, op: str, *args: Any, **kwargs: Any) -> Any:
            if op == "load":
                self.add(self.loads, (threading.get_ident(), time.monotonic()))
            return ask(handle, deadline, op, *args, **kwargs)

        def checked_quiet(*args: Any, **kwargs: Any) -> float:
            waited = quiet(*args, **kwargs)
            self.add(self.settling_at_quiet, ev._settling.count())
            return waited

        ev.judge.judge_shape = timed_shape  # type: ignore[method-assign]
        ev.judge.settle = slow_settle  # type: ignore[method-assign]
        ev.judge.ask = recorded_ask  # type: ignore[method-assign]
        ev._quiet = checked_quiet  # type: ignore[method-assign]

    def add(self, where: list[Any], item: Any) -> None:
        with self.lock:
            where.append(item)


def test_the_sandbox_takes_two_calls_where_the_pipeline_is_on(tmp_path: Path) -> None:
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "on", config=config_for("cpu", pipeline=True)) as ev:
        assert concurrent_calls(ev) == 2
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "off", config=config_for("cpu")) as ev:
        assert concurrent_calls(ev) == 1  # the default: measured no faster on an H100 host
    one_lane = config_for("cpu", pipeline=True, lanes=1)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "one", config=one_lane) as ev:
        assert concurrent_calls(ev) == 1


@pytest.mark.slow
def test_the_next_candidate_loads_during_the_checks_and_is_clocked_after_them(tmp_path: Path) -> None:
    config = config_for("cpu", pipeline=True, spares=2)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.warm_up(SHAPES)
        trace = Trace(ev)
        runtime = LocalRuntime(lambda: ev)
        candidates = copies(HONEST, 3)
        results = dict(runtime.evaluate(candidates, SHAPES))
        ev.wait_retired()

    assert sorted(results) == [0, 1, 2]
    for evaluation in results.values():
        assert evaluation.status is Status.PASSED, evaluation.feedback
        assert evaluation.fitness is not None
    # no clocked batch began while any candidate's checks ran
    assert trace.settling_at_quiet and not any(trace.settling_at_quiet)
    # no two candidates were judged at once: each thread's shapes in turn
    spans = sorted(trace.shapes, key=lambda s: s[1])
    for (who, _, end), (other, start, _) in itertools.pairwise(spans):
        assert who == other or end <= start, spans
    # a later candidate was loaded while an earlier one's checks ran
    overlapped = [(load_at, start, end) for _, load_at in trace.loads
                  for _, start, end in trace.checks if start < load_at < end]
    assert overlapped, (trace.loads, trace.checks)
    waited = [e.overheads.get("quiet_wait_s", 0.0) for e in results.values()]
    assert max(waited) > CHECKS_S / 3, waited  # that candidate waited for them to be clocked
    assert all(e.overheads.get("head_wait_s", 0.0) >= 0.0 for e in results.values())


@pytest.mark.slow
def test_a_wrong_candidate_found_in_the_checks_fails_with_the_next_one_judged_apart(
        tmp_path: Path) -> None:
    """A candidate caught by the checks after its last shape (it skips its work once it
    has been called often enough) fails; the honest one judged beside it passes."""
    config = config_for("cpu", pipeline=True, spares=2)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.warm_up(SHAPES)
        faker = load_candidate(CANDIDATES / "counts_calls.py", "dsa_topk")
        honest = copies(HONEST, 1)[0]
        results = dict(LocalRuntime(lambda: ev).evaluate([faker, honest], SHAPES))
    assert results[0].status is Status.INCORRECT, results[0].feedback
    assert results[0].fitness is None
    assert results[1].status is Status.PASSED, results[1].feedback


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["poisons_later.py", "leaves_cpu_busy.py"])
def test_a_cheat_aimed_at_the_next_candidate_changes_nothing_for_it_in_flight_together(
        tmp_path: Path, attack: str) -> None:
    """The red team's attacks on a later candidate (writing where it will read, a hog left
    running), with that candidate loading during the attacker's checks and the attacker's
    process slow to die: it passes with its fitness alone, within the suite's noise."""
    case = {c.file: c for c in load_suite()}[attack]
    config = config_for("cpu", pipeline=True, spares=2)
    with planted_secrets(), SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.warm_up(SHAPES)
        runtime = LocalRuntime(lambda: ev)
        honest = load_candidate(CANDIDATES / HONEST, "dsa_topk")
        alone = dict(runtime.evaluate([honest], SHAPES))[0]
        ev.wait_retired()
        slow_deaths(ev, 5.0, first_only=True)  # the attacker's process (and its hog) lingers
        with screen(ev, case.screen):
            out = dict(runtime.evaluate([load_candidate(CANDIDATES / attack, "dsa_topk"), honest], SHAPES))
    assert out[0].status in case.expected["cpu"], out[0].feedback
    assert alone.fitness is not None
    assert not check_follower(out[1], alone.fitness)
