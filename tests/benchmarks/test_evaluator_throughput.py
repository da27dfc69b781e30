"""benchmarks/evaluator_throughput.py: the profile samples the judge's thread alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.evaluator_throughput import (
    HostCpu,
    StackSampler,
    design_config,
    evaluations,
)
from evokernel.testing import FakeEvaluator, fake_candidate


def judged_here(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


def busy_elsewhere(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_the_profile_samples_one_thread(tmp_path: Path) -> None:
    stop = threading.Event()
    other = threading.Thread(target=busy_elsewhere, args=(stop,), daemon=True)
    other.start()
    try:
        with StackSampler(threading.get_ident(), period_s=0.001) as sampler:
            # until enough samples, not for a set time: on a loaded machine (a test run
            # beside another) the sampler's thread gets the GIL seldom
            deadline = time.perf_counter() + 30
            while sampler.samples <= 20 and time.perf_counter() < deadline:
                judged_here(0.05)
    finally:
        stop.set()
        other.join()
    names = " ".join(sampler.cumulative)
    assert sampler.samples > 20 and "judged_here" in names and "busy_elsewhere" not in names
    sampler.write(tmp_path / "profile.txt", candidates=2)
    text = (tmp_path / "profile.txt").read_text()
    assert "over 2 candidates" in text and "judged_here" in text


def test_an_unknown_design_stops_before_anything_is_timed() -> None:
    assert design_config("one_lane_collect_first", None) is not None
    with pytest.raises(SystemExit, match="unknown design"):
        design_config("judgee", None)


def test_a_quiet_suffix_makes_graph_replays_wait_for_spares() -> None:
    quiet, plain = design_config("one_lane_collect_first_quiet", None), design_config("one_lane_collect_first", None)
    assert quiet is not None and plain is not None
    assert quiet.quiet_graphs is True and plain.quiet_graphs is False
    assert quiet.lanes == plain.lanes == 1 and quiet.collect_first and plain.collect_first
    with pytest.raises(SystemExit, match="unknown design"):
        design_config("legacy_quiet", None)


def test_the_pipeline_is_what_tells_judge_from_pipelined() -> None:
    judge, pipelined = design_config("judge", None), design_config("pipelined", None)
    assert judge is not None and pipelined is not None
    assert judge.pipeline is False and pipelined.pipeline is True
    assert judge.lanes == pipelined.lanes == 2


@pytest.mark.parametrize("in_flight", [1, 2])
def test_candidates_stream_with_the_calls_in_flight_until_the_deadline(in_flight: int) -> None:
    evaluator = FakeEvaluator(delay_s=0.05, concurrent=in_flight)
    candidates = [fake_candidate(TILE=t) for t in (16, 32, 64, 128, 256)]
    done = list(evaluations(evaluator, candidates, ["s0"], time.perf_counter() + 60))
    assert sorted(c.id for c, _, _ in done) == sorted(c.id for c in candidates)
    assert all(result.candidate_id == c.id for c, result, _ in done)
    assert evaluator.peak_in_flight() == in_flight
    late = list(evaluations(evaluator, candidates, ["s0"], time.perf_counter() - 1))
    assert late == []  # nothing handed over past the deadline
    slow = FakeEvaluator(delay_s=0.2, concurrent=in_flight)
    cut = list(evaluations(slow, candidates, ["s0"], time.perf_counter() + 0.3))
    assert 1 <= len(cut) <= 2 * in_flight < len(candidates)  # the rest never handed over


def test_one_call_at_a_time_runs_in_the_calling_thread() -> None:
    """Where the judge's thread is profiled (one call at a time), it is this one."""
    seen: list[int] = []

    class Recording(FakeEvaluator):
        def evaluate(self, candidate: Any, shapes: Any) -> Any:
            seen.append(threading.get_ident())
            return super().evaluate(candidate, shapes)

    candidates = [fake_candidate(TILE=t) for t in (16, 32)]
    assert len(list(evaluations(Recording(), candidates, ["s0"], time.perf_counter() + 60))) == 2
    assert seen == [threading.get_ident()] * 2


def test_the_host_cpu_block_counts_the_judges_own_cpu() -> None:
    with HostCpu() as host:
        judged_here(0.3)
        time.sleep(0.2)
    assert 0.2 < host.judge_cpu_s < 0.6
    assert host.judge_cpu_over_wall is not None and 0.3 < host.judge_cpu_over_wall < 1.0
    assert host.busy_share is not None and 0.0 < host.busy_share <= 1.0
