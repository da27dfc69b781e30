"""Statistics for comparing strategies over seeds: medians, bootstrap intervals, rank tests.

Few seeds, skewed and censored outcomes (a run that never reached the target),
so everything here is rank- or resampling-based: the median with a percentile
bootstrap interval (seeded, so a rerun prints the same numbers), the two-sided
Mann-Whitney U test with Holm's correction across pairs, the Vargha-Delaney A
effect size, and Noether's approximation of the seeds each strategy needs for a
test to detect the observed effect. Censored values must be passed as a number
above every observed one (``budget + 1``): medians and ranks then treat them as
"more than the budget", which is exactly what is known.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from statistics import NormalDist

import numpy as np
import pandas as pd

RESAMPLES = 10_000
LEVEL = 0.95
SEED = 0


@dataclass(frozen=True)
class Interval:
    """A median and its bootstrap interval over ``n`` values."""

    median: float
    low: float
    high: float
    n: int
    level: float = LEVEL

    @property
    def width(self) -> float:
        return self.high - self.low


def bootstrap_median(values: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL,
                     seed: int = SEED) -> Interval:
    """Median of ``values`` and its percentile-bootstrap interval (same inputs, same numbers)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level)
    med, low, high = bootstrap_median_curve(x[:, None], resamples, level, seed)
    return Interval(float(med[0]), float(low[0]), float(high[0]), int(x.size), level)


def bootstrap_median_curve(matrix: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL,
                           seed: int = SEED, chunk: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column-wise median and bootstrap interval of a (runs x points) matrix.

    Whole rows (runs) are resampled, the same draws for every column, so the band
    of a trajectory is the band of one resampled set of runs.
    """
    m = np.asarray(matrix, dtype=float)
    n, points = m.shape
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    tail = (1 - level) / 2 * 100
    low, high = np.empty(points), np.empty(points)
    for start in range(0, points, chunk):
        block = m[:, start:start + chunk][idx]  # (resamples, n, cols)
        medians = np.median(block, axis=1)
        low[start:start + chunk], high[start:start + chunk] = np.percentile(medians, [tail, 100 - tail], axis=0)
    return np.median(m, axis=0), low, high


@dataclass(frozen=True)
class RankTest:
    u: float
    """U of the first sample."""
    p: float
    """Two-sided p-value."""
    a12: float
    """P(first > second) + P(tie) / 2: 0.5 is no effect."""


def _ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) and the sizes of the tie groups."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    values = x[order]
    ties = []
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return ranks, np.asarray(ties, dtype=float)


def _u_counts(m: int, n: int) -> list[int]:
    """Number of orderings giving each U in 0..m*n (no ties): f(i,j) = q^j f(i-1,j) + f(i,j-1)."""
    prev = [[1] for _ in range(n + 1)]  # i = 0: one ordering, U = 0
    for _ in range(m):
        cur = [[1]]  # j = 0
        for j in range(1, n + 1):
            shifted = [0] * j + prev[j]
            left = cur[j - 1]
            size = max(len(shifted), len(left))
            cur.append([(shifted[k] if k < len(shifted) else 0) + (left[k] if k < len(left) else 0)
                        for k in range(size)])
        prev = cur
    return prev[n]


def _mann_whitney_own(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p-value as scipy's ``mannwhitneyu(method='auto')`` computes it."""
    n1, n2 = len(x), len(y)
    ranks, ties = _ranks(np.concatenate([x, y]))
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    if (n1 <= 8 or n2 <= 8) and not (ties > 1).any():
        counts = _u_counts(n1, n2)
        p = 2 * sum(counts[round(u):]) / math.comb(n1 + n2, n1)
    else:
        total = n1 + n2
        s = math.sqrt(n1 * n2 / 12 * ((total + 1) - float((ties**3 - ties).sum()) / (total * (total - 1))))
        numerator = u - n1 * n2 / 2 - 0.5
        if s == 0:
            return 1.0
        p = 2 * (1 - NormalDist().cdf(numerator / s))
    return min(1.0, max(0.0, p))


def mann_whitney(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *,
                 use_scipy: bool = True) -> RankTest:
    """Two-sided Mann-Whitney U test; scipy's when importable, else an exact re-implementation."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size == 0 or b.size == 0:
        return RankTest(math.nan, math.nan, math.nan)
    ranks, _ = _ranks(np.concatenate([a, b]))
    u1 = float(ranks[: a.size].sum() - a.size * (a.size + 1) / 2)
    p: float | None = None
    if use_scipy:
        try:
            from scipy.stats import mannwhitneyu

            p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
        except ImportError:
            p = None
    if p is None or math.isnan(p):
        p = _mann_whitney_own(a, b)
    return RankTest(u1, p, u1 / (a.size * b.size))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: controls the family-wise error over all pairs."""
    k = len(pvalues)
    order = sorted(range(k), key=lambda i: pvalues[i])
    adjusted = [0.0] * k
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def seeds_needed(a12: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Seeds per strategy for a two-sided U test to detect effect ``a12`` (Noether 1987).

    None when there is no effect to detect (``a12 == 0.5``). An approximation for
    planning: it assumes the observed effect is the true one.
    """
    if math.isnan(a12) or a12 == 0.5:
        return None
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    total = z**2 / (3 * (a12 - 0.5) ** 2)  # 12 c (1 - c) with equal groups (c = 1/2)
    return max(2, math.ceil(total / 2))


def seeds_for_width(width: float, n: int, target: float) -> int | None:
    """Rough seeds needed to shrink an interval of ``width`` at ``n`` seeds to ``target`` (~1/sqrt(n))."""
    if n < 1 or target <= 0 or not math.isfinite(width):
        return None
    return max(n, math.ceil(n * (width / target) ** 2))


def pairwise(groups: Mapping[str, Sequence[float]], lower_is_better: bool, alpha: float = 0.05) -> pd.DataFrame:
    """Every pair of strategies: U test, Holm-adjusted p, effect, seeds needed.

    ``a_better`` is the probability that a run of ``a`` beats a run of ``b``
    (fewer evaluations when ``lower_is_better``; ties count half).
    """
    rows = []
    for a, b in combinations(list(groups), 2):
        test = mann_whitney(groups[a], groups[b])
        better = 1 - test.a12 if lower_is_better else test.a12
        rows.append({"a": a, "b": b, "n_a": len(groups[a]), "n_b": len(groups[b]), "u": test.u,
                     "p": test.p, "a_better": better, "seeds_needed": seeds_needed(better, alpha)})
    frame = pd.DataFrame(rows, columns=["a", "b", "n_a", "n_b", "u", "p", "a_better", "seeds_needed"])
    frame.insert(6, "p_holm", holm(list(frame["p"])) if len(frame) else [])
    frame["seeds_needed"] = pd.array(list(frame["seeds_needed"]), dtype="Int64")  # <NA>: no effect seen
    frame["significant"] = frame["p_holm"] < alpha
    return frame
