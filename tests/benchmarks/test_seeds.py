"""benchmarks/seeds.py's search gain on the held-out shapes."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.seeds import BEST_FOUND, heldout_gain, judge_in_groups, variant
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.testing import fake_candidate


def row(subject: str, shape: str, latency: float | None, cupti: float | None = None,
        status: str = "PASSED") -> dict[str, Any]:
    return {"subject": subject, "shape": shape, "status": status, "latency_us": latency, "cupti_us": cupti}


def test_gain_is_over_the_best_seed_default_by_cupti_where_both_have_it() -> None:
    rows = [
        row("fast_seed", "a", 10.0, 4.0), row("fast_seed", "b", 10.0, 8.0),
        row("slow_seed", "a", 30.0, 20.0), row("slow_seed", "b", 30.0, 20.0),
        row(BEST_FOUND, "a", 9.0, 2.0), row(BEST_FOUND, "b", 5.0, None),  # b: judge's figures
        row("fast_seed", "not_heldout", 1.0, 1.0), row(BEST_FOUND, "not_heldout", 100.0, 100.0),
    ]
    gain = heldout_gain(rows, {"a", "b"}, ["fast_seed", "slow_seed"])
    assert gain["search_gain_heldout_best_seed"] == "fast_seed"
    assert gain["search_gain_heldout"] == pytest.approx((4.0 / 2.0 * 10.0 / 5.0) ** 0.5)
    assert gain["search_gain_heldout_min"] == pytest.approx(2.0)
    assert gain["search_gain_heldout_shapes"] == 2


def test_no_gain_when_the_best_found_fails_a_heldout_shape() -> None:
    rows = [row("s", "a", 10.0, 4.0), row("s", "b", 10.0, 4.0),
            row(BEST_FOUND, "a", 1.0, 0.5), row(BEST_FOUND, "b", None, None, status="INCORRECT")]
    assert heldout_gain(rows, {"a", "b"}, ["s"])["search_gain_heldout"] is None


def test_a_seed_that_failed_a_heldout_shape_is_not_the_best_seed() -> None:
    rows = [row("broken", "a", 1.0, 1.0), row("broken", "b", None, status="INCORRECT"),
            row("s", "a", 10.0, 4.0), row("s", "b", 10.0, 4.0),
            row(BEST_FOUND, "a", 2.0, 2.0), row(BEST_FOUND, "b", 2.0, 2.0)]
    gain = heldout_gain(rows, {"a", "b"}, ["broken", "s"])
    assert gain["search_gain_heldout_best_seed"] == "s" and gain["search_gain_heldout"] == pytest.approx(2.0)


def test_subjects_are_judged_group_after_group_and_a_failure_ends_a_subject() -> None:
    """All subjects on the first group of shapes, then all on the next (the judge makes a
    group's inputs once); a subject that failed is not judged again, and its evaluation
    holds every shape result it got."""
    calls: list[tuple[str, tuple[str, ...]]] = []

    class Judge:
        def evaluate(self, subject: str, shapes: list[str]) -> Evaluation:
            calls.append((subject, tuple(shapes)))
            failed = subject == "bad" and "c" in shapes
            status = Status.INCORRECT if failed else Status.PASSED
            timing = Timing(median_ms=1.0, p25_ms=1.0, p75_ms=1.0, e2e_ms=1.0, samples=1, method="judge-graph")
            return Evaluation(candidate_id=subject, status=status, shapes=tuple(
                ShapeResult(shape=s, status=Status.INCORRECT) if failed and s == "c"
                else ShapeResult(shape=s, status=Status.PASSED, timing=timing) for s in shapes))

    judged = judge_in_groups(Judge(), [("good", "good"), ("bad", "bad")],  # type: ignore[arg-type]
                             [["a", "b"], ["c", "d"], ["e"]])
    assert calls == [("good", ("a", "b")), ("bad", ("a", "b")), ("good", ("c", "d")), ("bad", ("c", "d")),
                     ("good", ("e",))]
    assert judged["good"].status is Status.PASSED and [s.shape for s in judged["good"].shapes] == list("abcde")
    assert judged["bad"].status is Status.INCORRECT and [s.shape for s in judged["bad"].shapes] == list("abcd")


def test_a_variant_changes_knobs_and_launch_parameters_alike() -> None:
    """``--variant SEED:NAME=VALUE,...`` sorts each name into the seed's knobs or its
    launch parameters (cuda_family's WARPS and CTAS are launch parameters)."""
    seed = fake_candidate()
    knob, launch = sorted(seed.knob_space)[0], sorted(seed.launch_space)[0]
    k_value = next(c for c in seed.knob_space[knob].choices if c != seed.params[knob])
    l_value = next(c for c in seed.launch_space[launch].choices if c != seed.params[launch])
    name, child = variant({"s": seed}, f"s:{knob}={k_value},{launch}={l_value}")
    assert name == f"s[{knob}={k_value},{launch}={l_value}]"
    assert child.knobs[knob] == k_value and child.launch[launch] == l_value
    with pytest.raises(ValueError, match="declares no parameter"):
        variant({"s": seed}, "s:NOT_A_PARAMETER=1")
    with pytest.raises(ValueError, match="want SEED:NAME=VALUE"):
        variant({"s": seed}, "other:X=1")
