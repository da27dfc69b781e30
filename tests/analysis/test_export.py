"""The FlashInfer-Trace export reads the checkers' own statistics."""

from __future__ import annotations

from evokernel.analysis.export import traces
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.journal import Record


def test_a_traces_correctness_carries_the_checkers_errors() -> None:
    timing = Timing(median_ms=0.01, p25_ms=0.01, p75_ms=0.01, e2e_ms=0.1, samples=3, method="judge-graph")
    shape = ShapeResult(shape="s0", status=Status.PASSED, timing=timing, reference=timing,
                        stats={"max_abs_error": 0.25, "max_rel_error": 0.002, "phase_bind_ms": 1.0})
    evaluation = Evaluation(candidate_id="c", status=Status.PASSED, shapes=(shape,),
                            environment={"device": "NVIDIA H200"})
    record = Record(seq=0, generation=0, index=0, candidate_id="c", evaluation=evaluation, candidate={})
    (trace,) = traces(record, "dsa_topk_def", "sol", {"s0": {"batch_size": 1}})
    correctness = trace["evaluation"]["correctness"]
    assert correctness["max_absolute_error"] == 0.25
    assert correctness["max_relative_error"] == 0.002
