"""Red team 2: the CUPTI figure is a claim of the candidate's process; the judge keeps it
only where it agrees with its own clock. These cases hand ``believe_cupti`` claims a
lying process could make (it runs the candidate's code, so it can patch its own CUPTI
wrapper) and say which must not be believed; and ``Judge.collect_cupti`` a process that
reports per shape, or dies. No GPU needed: only the rule and the bookkeeping run."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from evokernel.evaluate.channel import ChannelClosed
from evokernel.evaluate.judge import Judge, JudgeConfig, believe_cupti
from evokernel.evaluate.result import ShapeResult, Status, Timing


def cupti_of(judge_median_s: float, spans_ms: list[float]) -> tuple[float | None, str]:
    """The judge's rule on spans claimed for ten calls that took 2 ms by its clock."""
    return believe_cupti(spans_ms, 0.002, judge_median_s, None)


class ReportingHandle:
    """A candidate's process that answers ``cupti_collect`` with the given spans by shape,
    or dies when asked."""

    def __init__(self, spans: dict[str, Any] | None) -> None:
        self.spans = spans
        self.asked: str | None = None

    def send(self, op: str, **fields: Any) -> None:
        assert op == "cupti_collect" and self.asked is None
        self.asked = op

    def answered(self) -> bool:
        return self.asked is not None

    def receive(self, timeout_s: float | None) -> dict[str, Any]:
        assert self.asked is not None
        self.asked = None
        if self.spans is None:
            raise ChannelClosed("the process is gone")
        return {"spans_ms": self.spans}

    def kill(self) -> None:
        pass

    def exit_code(self) -> int:
        return -9


def _passed(shape: str) -> ShapeResult:
    return ShapeResult(shape=shape, status=Status.PASSED,
                       timing=Timing(median_ms=0.011, p25_ms=0.01, p75_ms=0.012, e2e_ms=0.05,
                                     samples=30, method="judge-graph"))


def test_collected_spans_are_judged_per_shape_and_a_dead_process_loses_only_the_figure() -> None:
    judge = Judge(JudgeConfig(), torch.device("cpu"))
    results = [_passed("a"), _passed("b"), _passed("c")]
    judge.begin()
    judge._cupti_pending = {"a": (0.002, 11e-6), "b": (0.002, 11e-6)}  # c took no CUPTI calls
    honest, liar = [0.0015] * 10, [1e-6] * 10
    handle: Any = ReportingHandle({"a": honest, "b": liar})
    out = judge.collect_cupti(handle, results, float("inf"))
    assert [r.status for r in out] == [Status.PASSED] * 3
    assert out[0].timing is not None and out[0].timing.cupti_ms == pytest.approx(0.0015)
    assert out[1].timing is not None and out[1].timing.cupti_ms is None
    assert "not believed" in out[1].timing.cupti_note
    assert out[2] == results[2]
    assert judge.collect_cupti(handle, results, float("inf")) == results  # nothing pending now

    judge._cupti_pending = {"a": (0.002, 11e-6)}
    out = judge.collect_cupti(ReportingHandle(None), results, float("inf"))  # type: ignore[arg-type]
    assert out[0].status is Status.PASSED and out[0].timing is not None
    assert out[0].timing.cupti_ms is None and "died" in out[0].timing.cupti_note


@pytest.mark.parametrize("judge_us", [3.0, 7.5])
def test_a_one_nanosecond_claim_is_not_believed_for_a_fast_kernel(judge_us: float) -> None:
    """Below 8 us by the judge's clock, half the figure less 4 us is below zero: any
    positive span passes, so a process can claim 1 ns per call (a speedup_cupti in the
    millions, which the mean in benchmarks/seeds.py then reports)."""
    cupti_ms, _note = cupti_of(judge_us * 1e-6, [1e-6] * 10)
    assert cupti_ms is None, f"a 1 ns CUPTI span believed for a {judge_us} us kernel"



def test_spans_that_vary_widely_are_not_believed() -> None:
    """One call did the work of all ten, the others launched a trifle: the median is
    the trifle's, not the kernel's."""
    cupti_ms, note = cupti_of(6e-6, [0.05] + [0.0015] * 9)
    assert cupti_ms is None and "for the same work" in note


@pytest.mark.parametrize("spans", [
    [float("nan")] * 10,  # all NaN: a NaN figure, every test below false
    [float("nan")] + [0.0015] * 4 + [0.05] * 5,  # one NaN: the sum and spread tests false
    [float("inf")] + [0.011] * 9,  # refused before as well (by its sum), now said plainly
])
def test_a_span_that_is_not_a_finite_number_is_not_believed(spans: list[float]) -> None:
    """The reply is JSON, which carries NaN and Infinity, and a lying process writes it.
    A NaN compares false with everything: all NaN, the figure was NaN and believed (NaN
    speedup_cupti); one NaN first, ``sum`` and ``max`` were NaN, and spans 33x apart
    were believed (median 0.026 ms)."""
    import json

    claimed = json.loads(json.dumps({"spans_ms": spans}))["spans_ms"]  # as the judge reads it
    cupti_ms, note = cupti_of(11e-6, claimed)
    assert cupti_ms is None and "not a finite number" in note


def test_an_honest_launch_bound_span_is_believed() -> None:
    """cuda_radix on the H200's no-scoring shapes: 1.4-1.6 us by CUPTI where the judge's
    batches said 11-17 us (their launch gaps included)."""
    cupti_ms, note = cupti_of(11e-6, [0.0014, 0.0015, 0.0016, 0.0014, 0.0015] * 2)
    assert cupti_ms is not None and abs(cupti_ms - 0.0015) < 1e-4, note


def test_spans_by_bisection_equal_the_scan_of_every_record() -> None:
    """``spans_of`` (what ``CuptiSpans.collect`` reports) finds, per window, the device
    records that started inside it, as a scan of every record per window does."""
    import random

    from evokernel.evaluate.timing import spans_of

    rng = random.Random(3)
    device = [(s, s + rng.randrange(1, 500)) for s in (rng.randrange(10_000) for _ in range(600))]
    windows = {"a": [(0, 900), (1000, 1001), (2000, 4500)], "b": [(5000, 9999), (20_000, 30_000)]}

    def scanned(start: int, end: int) -> float | None:
        found = [(s, e) for s, e in device if start <= s <= end]
        return (max(e for _, e in found) - min(s for s, _ in found)) / 1e6 if found else None

    got = spans_of(windows, device)
    assert got == {k: [scanned(s, e) for s, e in pairs] for k, pairs in windows.items()}
    assert got["b"][1] is None


def test_a_span_counts_what_started_in_its_window_and_runs_past_it() -> None:
    """The judge's L2 flush before a call ran before the window opened: not counted; a
    kernel that started inside the window counts to its end."""
    from evokernel.evaluate.timing import spans_of

    flush, first, second = (100, 180), (210, 250), (260, 400)
    assert spans_of({"x": [(200, 390)]}, [flush, second, first]) == {"x": [(400 - 210) / 1e6]}


def test_only_finite_numbers_from_a_reply_enter_a_record() -> None:
    from evokernel.evaluate.judge import _finite_number

    assert _finite_number(3) and _finite_number(0.5)
    for value in (float("nan"), float("inf"), -float("inf"), True, "1.0", None):
        assert not _finite_number(value)
