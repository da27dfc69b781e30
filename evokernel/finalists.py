"""Measure a finished run's best candidates again before one of them is named the best.

A search keeps the largest of hundreds of noisy figures, so the figure it keeps is
biased upward (the winner's curse: on an H100 on 2026-12-06 a search's best, 571.6x in
the run, measured 0.86x its seed when timed again beside it). After the budget is spent,
the ``count`` best passing candidates of the search and the best seed are evaluated
``rounds`` more times by the run's own runtime, in interleaved rounds: round r evaluates
every finalist once, in an order rotated by r, so that a drift of the host's speed
reaches all of them alike.

A finalist's **confirmed fitness** is the median of its fresh fitnesses; the figure the
search kept is shown beside it but not counted (it was selected for being high). A
finalist that fails any fresh evaluation is not confirmed and ranks below every
confirmed one: a kernel with a race that passed once shows up here. The **best found**
is the confirmed finalist with the highest confirmed fitness, and the **search gain**
its confirmed fitness over the best seed's, both from the same rounds, with its range
over the fresh figures: a gain whose low end is below 1 is within the judge's noise
(on an H100, 2026-12-06, dsa_topk's finalists spread by up to 12% over three rounds).

With several evaluators (a Ray runtime over several GPUs), a finalist's rounds go to
whichever is free, so the rounds reach every finalist alike only in distribution, not on
one device; the comparison is exact with one evaluator.

These evaluations are not charged to the search's budget (the comparison of strategies
at equal budgets does not include them); their device seconds are reported beside it.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.runtime import Runtime

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finalist:
    """One candidate measured again: what the search saw and what the fresh rounds saw."""

    candidate_id: str
    name: str
    is_seed: bool
    in_search: float
    """The fitness the search kept (its single evaluation)."""
    fresh: tuple[Evaluation, ...]

    @property
    def confirmed(self) -> bool:
        """Every fresh evaluation passed."""
        return bool(self.fresh) and all(e.fitness is not None for e in self.fresh)

    @property
    def fitness(self) -> float | None:
        """Median fresh fitness, or None unless confirmed."""
        if not self.confirmed:
            return None
        return statistics.median(e.fitness for e in self.fresh if e.fitness is not None)

    @property
    def fresh_range(self) -> tuple[float, float] | None:
        values = [e.fitness for e in self.fresh if e.fitness is not None]
        return (min(values), max(values)) if values else None

    @property
    def failure(self) -> str:
        """The first fresh evaluation that did not pass, as ``STATUS (round n): feedback``."""
        for i, e in enumerate(self.fresh, start=1):
            if e.fitness is None:
                why = (e.feedback or e.log or "").strip().splitlines()
                return f"{e.status.value} (round {i})" + (f": {why[0][:160]}" if why else "")
        return ""

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate_id, "name": self.name, "seed": self.is_seed,
                "in_search": self.in_search, "confirmed": self.confirmed, "fitness": self.fitness,
                "fresh": [{"status": e.status.value, "fitness": e.fitness, "mean_speedup": e.mean_speedup,
                           "device_s": e.device_s} for e in self.fresh],
                "failure": self.failure}


@dataclass(frozen=True)
class Finals:
    """The finalists, best first: confirmed ones by confirmed fitness, then the rest."""

    finalists: tuple[Finalist, ...]
    rounds: int
    device_s: float
    """Device seconds the fresh evaluations took (not charged to the search's budget)."""

    @property
    def best(self) -> Finalist | None:
        """The confirmed finalist with the highest confirmed fitness (it may be the seed)."""
        return next((f for f in self.finalists if f.confirmed), None)

    @property
    def best_seed(self) -> Finalist | None:
        return next((f for f in self.finalists if f.is_seed), None)

    @property
    def gain(self) -> float | None:
        """Best found over best seed, both confirmed in the same rounds; None if either is not."""
        best, seed = self.best, self.best_seed
        if best is None or seed is None or best.fitness is None or seed.fitness is None:
            return None
        return best.fitness / seed.fitness

    @property
    def gain_range(self) -> tuple[float, float] | None:
        """The gain's extremes over the fresh figures (best's lowest over seed's highest, and
        its highest over seed's lowest); a low end above 1 means the rounds separate them."""
        best, seed = self.best, self.best_seed
        if best is None or seed is None or best is seed:
            return None
        b, s = best.fresh_range, seed.fresh_range
        if b is None or s is None:
            return None
        return b[0] / s[1], b[1] / s[0]

    def to_json(self) -> dict[str, Any]:
        best, spread = self.best, self.gain_range
        return {"rounds": self.rounds, "device_s": self.device_s,
                "best": best.candidate_id if best else None, "gain_over_best_seed": self.gain,
                "gain_range": list(spread) if spread else None,
                "finalists": [f.to_json() for f in self.finalists]}

    def lines(self) -> list[str]:
        """What a person reads: one line per finalist, then the verdict."""
        out = [f"finalists measured {self.rounds} more times each ({self.device_s:.1f} device seconds, "
               "not charged to the budget); confirmed fitness = median of the fresh figures:"]
        for f in self.finalists:
            role = "best seed" if f.is_seed else "found"
            if f.confirmed:
                low, high = f.fresh_range or (0.0, 0.0)
                fresh = f"confirmed {f.fitness:.3f} (range {low:.3f}-{high:.3f})"
            else:
                fresh = f"NOT confirmed: {f.failure}"
            out.append(f"  {f.candidate_id} {f.name} [{role}]: in the search {f.in_search:.3f}, {fresh}")
        best, gain = self.best, self.gain
        if best is None:
            out.append("no finalist was confirmed: the run names no best")
        elif best.is_seed:
            out.append(f"best found: the seed {best.candidate_id} (the search found nothing faster that held)")
        else:
            spread = self.gain_range
            verdict = ""
            if spread:
                apart = "faster in every round" if spread[0] > 1 else "not separated from the seed by these rounds"
                verdict = f" (range {spread[0]:.3f}-{spread[1]:.3f}: {apart})"
            out.append(f"best found: {best.candidate_id}" + (f", {gain:.3f}x the best seed{verdict}" if gain else ""))
        return out


def pick(ranked: Sequence[tuple[str, Evaluation]], seed_ids: set[str], count: int) -> list[tuple[str, float]]:
    """``count`` best passing non-seed candidates and the best passing seed, as (id, fitness
    in the search), best first; ``ranked`` is every evaluated candidate, best first."""
    passed = [(cid, ev.fitness) for cid, ev in ranked if ev.fitness is not None]
    found = [(cid, fit) for cid, fit in passed if cid not in seed_ids][:count]
    seed = next(((cid, fit) for cid, fit in passed if cid in seed_ids), None)
    chosen = found + ([seed] if seed else [])
    return sorted(chosen, key=lambda pair: -pair[1])


def measure(runtime: Runtime, finalists: Sequence[tuple[Candidate, float]], seed_ids: set[str],
            shapes: Sequence[str], rounds: int) -> Finals:
    """Evaluate every finalist ``rounds`` more times on ``shapes``, interleaved and rotated."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    n = len(finalists)
    order = [(r, (i + r) % n) for r in range(rounds) for i in range(n)]
    logger.info("measuring %d finalist(s) %d more times each (%d evaluations)", n, rounds, len(order))
    fresh: dict[tuple[int, int], Evaluation] = {}
    for done, (k, evaluation) in enumerate(runtime.evaluate([finalists[i][0] for _, i in order], shapes), 1):
        fresh[order[k]] = evaluation
        logger.info("finalist evaluation %d/%d: %s %s %s", done, len(order), evaluation.candidate_id,
                    evaluation.status.value, "-" if evaluation.fitness is None else f"{evaluation.fitness:.3f}")
    measured = [Finalist(cand.id, cand.name, cand.id in seed_ids, in_search,
                         tuple(fresh[(r, i)] for r in range(rounds)))
                for i, (cand, in_search) in enumerate(finalists)]
    measured.sort(key=lambda f: (not f.confirmed, -(f.fitness or 0.0), -f.in_search))
    return Finals(tuple(measured), rounds, sum(e.device_s for e in fresh.values()))

