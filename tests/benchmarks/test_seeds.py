"""benchmarks/seeds.py's search gain on the held-out shapes."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.seeds import BEST_FOUND, heldout_gain


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
