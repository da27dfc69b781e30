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
