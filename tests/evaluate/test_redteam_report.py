"""What the red team says of a harmed follower: where it lost most, with both figures."""

from __future__ import annotations

from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing

from .redteam import most_slowed


def _timing(ms: float, cupti_ms: float | None = None) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=3, method="judge-eager",
                  cupti_ms=cupti_ms)


def _evaluation(per_shape: dict[str, float]) -> Evaluation:
    shapes = tuple(ShapeResult(shape=shape, status=Status.PASSED, timing=_timing(ms, ms / 2),
                               reference=_timing(1.0)) for shape, ms in per_shape.items())
    return Evaluation(candidate_id="c", status=Status.PASSED, shapes=shapes)


def test_the_shape_lost_most_on_is_named_with_both_runs_figures() -> None:
    alone = _evaluation({"aaaaaaaa-1": 0.010, "bbbbbbbb-2": 0.020})
    after = _evaluation({"aaaaaaaa-1": 0.012, "bbbbbbbb-2": 0.060})
    said = most_slowed(after, alone)
    assert said.startswith("most on bbbbbbbb (3.00x slower)")
    assert "after it median 60.0 us (judge-eager), CUPTI 30.0 us" in said
    assert "alone median 20.0 us (judge-eager), CUPTI 10.0 us" in said
    assert most_slowed(after, _evaluation({"cccccccc-3": 0.01})) == "no shape to compare"
