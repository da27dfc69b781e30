"""Statistics on known inputs: bootstrap medians, the U test, Holm, censoring, seeds needed."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from evokernel.analysis import stats, tables


def test_bootstrap_median_is_seeded_and_brackets_the_median() -> None:
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 61]
    a = stats.bootstrap_median(values)
    assert a == stats.bootstrap_median(values)  # same inputs, same numbers
    assert a.median == 5.5 and a.n == 10 and a.level == 0.95
    assert a.low <= a.median <= a.high
    narrow = stats.bootstrap_median(values, level=0.5)
    assert a.low <= narrow.low <= narrow.high <= a.high


def test_bootstrap_of_constant_values_has_zero_width() -> None:
    iv = stats.bootstrap_median([7.0] * 5, resamples=500)
    assert (iv.median, iv.low, iv.high, iv.width) == (7.0, 7.0, 7.0, 0.0)
    assert math.isnan(stats.bootstrap_median([]).median)


def test_curve_resamples_whole_runs() -> None:
    matrix = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [2.0, 4.0, 6.0]])
    med, low, high = stats.bootstrap_median_curve(matrix, resamples=200)
    assert list(med) == [1.0, 2.0, 3.0]
    assert (low <= med).all() and (med <= high).all()
    assert list(high) == [2.0, 4.0, 6.0]


@pytest.mark.parametrize("use_scipy", [True, False])
def test_mann_whitney_known_values(use_scipy: bool) -> None:
    t = stats.mann_whitney([1, 2, 3], [4, 5, 6], use_scipy=use_scipy)
    assert t.u == 0 and t.a12 == 0.0
    assert t.p == pytest.approx(0.1)  # exact: 2 of C(6,3) = 20 orderings are as extreme
    tied = stats.mann_whitney([5, 5, 5], [5, 5, 5], use_scipy=use_scipy)
    assert tied.p == 1.0 and tied.a12 == 0.5


def test_own_mann_whitney_matches_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for trial in range(200):
        n1, n2 = (int(v) for v in rng.integers(1, 14, 2))
        if trial % 2:
            x, y = rng.integers(0, 5, n1).astype(float), rng.integers(0, 5, n2).astype(float)  # ties
        else:
            x, y = rng.normal(size=n1), rng.normal(0.7, size=n2)
        want = scipy_stats.mannwhitneyu(x, y, alternative="two-sided").pvalue
        assert stats._mann_whitney_own(x, y) == pytest.approx(want, abs=1e-12)


def test_holm() -> None:
    assert stats.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert stats.holm([0.2, 0.01, 0.03]) == pytest.approx([0.2, 0.03, 0.06])
    assert stats.holm([]) == []


def test_seeds_needed() -> None:
    assert stats.seeds_needed(0.5) is None
    assert stats.seeds_needed(0.8) == 15  # (1.96 + 0.84)^2 / (3 * 0.3^2) / 2 = 14.5
    assert stats.seeds_needed(0.2) == stats.seeds_needed(0.8)
    assert stats.seeds_needed(1.0) == 6
    assert stats.seeds_for_width(10.0, 10, 5.0) == 40


def test_pairwise_direction_and_holm() -> None:
    groups = {"fast": [3.0, 4, 5, 6, 7, 8], "slow": [20.0, 21, 22, 23, 24, 25], "same": [20.0, 21, 22, 23, 24, 25]}
    pairs = stats.pairwise(groups, lower_is_better=True)
    row = pairs[(pairs["a"] == "fast") & (pairs["b"] == "slow")].iloc[0]
    assert row["a_better"] == 1.0 and row["significant"]
    assert row["p_holm"] >= row["p"]
    same = pairs[(pairs["a"] == "slow") & (pairs["b"] == "same")].iloc[0]
    assert same["a_better"] == 0.5 and pd.isna(same["seeds_needed"]) and not same["significant"]


def _frame(best: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    rows = []
    for (strategy, seed), values in best.items():
        for i, b in enumerate(values, start=1):
            rows.append({"strategy": strategy, "seed": seed, "index": i, "best_so_far": b,
                         "spent_device_s": 0.5 * i})
    return pd.DataFrame(rows)


def test_censored_runs_are_kept_and_counted() -> None:
    frame = _frame({("a", 0): [1, 2, 9, 10], ("a", 1): [1, 1, 1, 1], ("b", 0): [10, 10, 10, 10]})
    reach = tables.to_target(frame, target=9.0, budget=4)
    assert list(reach["reached"]) == [True, False, True]
    assert list(reach["cost"]) == [3.0, 5.0, 1.0]  # never reached: budget + 1, not dropped
    assert list(reach["final_best"]) == [10.0, 1.0, 10.0]
    seconds = tables.to_target(frame, target=9.0, budget=2.0, unit="device_s")
    assert list(seconds["cost"]) == [1.5, 3.0, 0.5]
    iv = stats.bootstrap_median(reach[reach["strategy"] == "a"]["cost"])
    assert iv.high == 5.0  # the interval reaches past the budget: honestly unbounded
