"""Lanes: a used process's retiring in the background, waited for when its lane serves again."""

from __future__ import annotations

import threading
import time

import pytest

from evokernel.evaluate.lanes import Lane
from evokernel.evaluate.process import SparePool


def _lane() -> Lane:
    never = SparePool(1, start=lambda tag: pytest.fail("no process starts here"), chunks=dict)
    return Lane(0, never)


def test_retiring_runs_in_the_background_and_is_waited_for() -> None:
    lane = _lane()
    release = threading.Event()

    def steps(spent: dict[str, float]) -> None:
        release.wait(5)
        spent["kill_s"] = 0.25

    lane.retire_behind(steps)
    assert lane.retiring()
    release.set()
    assert lane.await_retired() >= 0
    assert not lane.retiring()
    assert lane.take_retired_in() == {"kill_s": 0.25}
    assert lane.take_retired_in() == {}  # given once
    assert lane.await_retired() < 0.1  # nothing to wait for


def test_a_failed_retiring_is_raised_once_and_the_lane_goes_on() -> None:
    lane = _lane()

    def failing(spent: dict[str, float]) -> None:
        spent["kill_s"] = 0.1
        raise OSError("scrub failed")

    lane.retire_behind(failing)
    with pytest.raises(RuntimeError, match="scrubbing after a candidate failed"):
        lane.await_retired()
    assert lane.take_retired_in() == {"kill_s": 0.1}  # what it did before it failed
    lane.await_retired()  # raised once: the lane may serve again


def test_a_new_retiring_waits_for_the_last_one_first() -> None:
    lane = _lane()
    order: list[str] = []

    def slow(spent: dict[str, float]) -> None:
        time.sleep(0.2)
        order.append("first")

    lane.retire_behind(slow)
    lane.retire_behind(lambda spent: order.append("second"))
    lane.await_retired()
    assert order == ["first", "second"]


def test_with_no_thread_to_be_had_the_process_is_retired_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate that took every task of the host left the judge unable to start the
    thread that kills it (red team 8, takes_every_task.py): the thread, unstarted, failed
    every later wait, and the process lived on. The lane then retires it in the caller."""
    lane = _lane()
    done: list[str] = []

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    lane.retire_behind(lambda spent: done.append("killed"))
    assert done == ["killed"] and not lane.retiring()
    assert lane.await_retired() < 0.1  # nothing left to wait for, nothing to raise
    lane.retire_behind(lambda spent: done.append("again"))  # and the lane goes on
    assert done == ["killed", "again"]


def test_a_spare_pool_with_no_thread_to_be_had_does_not_raise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = SparePool(2, start=lambda tag: pytest.fail("no process starts here"), chunks=dict)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    pool.fill()  # logged; ``take`` tries again until its time is up


class _Handle:
    def __init__(self) -> None:
        self.start_steps_s: dict[str, float] = {}

    def ready(self) -> None: ...
    def map(self, chunks: object) -> None: ...
    def kill(self) -> None: ...
    def alive(self) -> bool:
        return True


def test_await_started_returns_once_no_spare_is_starting() -> None:
    """The CPU judge's quiet: a spare's start is waited for before a clocked batch."""
    release = threading.Event()

    def start(tag: str) -> _Handle:
        release.wait(5)
        return _Handle()

    pool = SparePool(1, start=start, chunks=dict)  # type: ignore[arg-type]
    pool.fill()
    assert pool.await_started(timeout_s=0.2) >= 0.2  # still starting: waited out its bound
    threading.Timer(0.3, release.set).start()
    waited = pool.await_started(timeout_s=5)
    assert 0.05 < waited < 4, waited
    assert pool.await_started(timeout_s=5) < 0.05  # nothing starting: no wait
    pool.close()


def test_a_taken_spare_says_how_long_it_took_to_start() -> None:
    """``ready_in_s``: from the start of its launch until it was ready (the throughput
    breakdown's ``spare_start_s``, to tell a slow start from a pool run dry)."""

    def start(tag: str) -> _Handle:
        time.sleep(0.1)
        return _Handle()

    pool = SparePool(1, start=start, chunks=dict)  # type: ignore[arg-type]
    handle = pool.take(timeout_s=5)
    assert 0.1 <= handle.ready_in_s < 4  # type: ignore[attr-defined]
    steps = handle.start_steps_s  # type: ignore[attr-defined]
    assert set(steps) == {"spare_answer_s", "spare_map_s", "spare_bind_s"}
    assert steps["spare_answer_s"] >= 0.1
    assert abs(sum(steps.values()) - handle.ready_in_s) < 1e-6  # type: ignore[attr-defined]
    pool.close()


def _counted_pool(size: int) -> tuple[SparePool, list[str]]:
    """A pool of ``size`` fake processes, every one ready, and the tags of all it started."""
    starts: list[str] = []

    def start(tag: str) -> _Handle:
        starts.append(tag)
        return _Handle()

    pool = SparePool(size, start=start, chunks=dict)  # type: ignore[arg-type]
    assert pool.ready(timeout_s=5) == size and len(starts) == size
    return pool, starts


def test_a_take_without_refill_leaves_the_replacement_to_the_caller() -> None:
    """``quiet_graphs``: the replacement of a taken spare starts when the judge says (``fill``)."""
    pool, starts = _counted_pool(2)
    pool.take(refill=False)
    assert pool.await_started(timeout_s=5) < 1 and len(starts) == 2  # none started
    pool.fill()
    pool.await_started(timeout_s=5)
    assert len(starts) == 3
    pool.take()  # by default the replacement starts at once
    pool.await_started(timeout_s=5)
    assert len(starts) == 4
    pool.close()


def test_a_low_water_fill_starts_the_missing_spares_together_once_half_are_used() -> None:
    pool, starts = _counted_pool(4)
    pool.take(refill=False)
    pool.fill(low_water=2)  # 3 left: nothing starts
    pool.await_started(timeout_s=5)
    assert len(starts) == 4
    pool.take(refill=False)
    pool.fill(low_water=2)  # 2 left: both missing start
    pool.await_started(timeout_s=5)
    assert len(starts) == 6
    pool.close()
