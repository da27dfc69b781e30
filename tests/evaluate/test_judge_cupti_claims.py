"""Red team 2: the CUPTI figure is a claim of the candidate's process; the judge keeps it
only where it agrees with its own clock. These cases hand ``Judge._cupti`` claims a
lying process could make (it runs the candidate's code, so it can patch its own CUPTI
wrapper) and say which must not be believed. No GPU needed: the judge's device work
is stubbed, only the believability rule runs."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from evokernel.evaluate.judge import Answers, Judge, JudgeConfig


class ClaimingHandle:
    """A candidate's process that answers the CUPTI request with made-up spans."""

    def __init__(self, spans_ms: list[float]) -> None:
        self.spans_ms = spans_ms

    def request(self, op: str, timeout_s: float | None, **fields: Any) -> dict[str, Any]:
        assert op == "cupti"
        time.sleep(0.002)  # ten flushed, synchronised calls take at least this
        return {"spans_ms": self.spans_ms}


def cupti_of(judge_median_s: float, spans_ms: list[float]) -> tuple[float | None, str]:
    judge = Judge(JudgeConfig(cupti_calls=len(spans_ms)), torch.device("cpu"))
    judge.device = torch.device("cuda")  # _cupti runs only on a GPU; its device work is stubbed
    judge.sync = lambda: None  # type: ignore[method-assign]
    judge._write = lambda bank, assignment: None  # type: ignore[method-assign]
    judge._verify = lambda *args, **kwargs: {}  # type: ignore[method-assign]
    judge._sample = lambda *args, **kwargs: set()  # type: ignore[method-assign]
    bank = SimpleNamespace(slot_count=64, config=SimpleNamespace(bases=2), shape="s",
                           snapshot=lambda: [])
    return judge._cupti(ClaimingHandle(spans_ms), bank, random.Random(0), float("inf"),  # type: ignore[arg-type]
                        lambda base: object(), judge_median_s, Answers(), {})


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


def test_an_honest_launch_bound_span_is_believed() -> None:
    """cuda_radix on the H200's no-scoring shapes: 1.4-1.6 us by CUPTI where the judge's
    batches said 11-17 us (their launch gaps included)."""
    cupti_ms, note = cupti_of(11e-6, [0.0014, 0.0015, 0.0016, 0.0014, 0.0015] * 2)
    assert cupti_ms is not None and abs(cupti_ms - 0.0015) < 1e-4, note
