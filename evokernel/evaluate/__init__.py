"""The evaluation cascade: build, correctness on fresh inputs, timing, fitness.

``Evaluator`` is the one interface the search engine uses; implementations run
candidates in isolated processes on a GPU or the CPU, or replay recorded results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing

__all__ = ["Concurrent", "Evaluation", "Evaluator", "Preparing", "ShapeResult", "Status", "Timing",
           "Warming", "concurrent_calls"]


@runtime_checkable
class Evaluator(Protocol):
    """Judges candidates. Never raises for a bad candidate: the status says it."""

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        """Evaluate ``candidate`` on the named shapes of its workload."""
        ...

    def close(self) -> None:
        """Release worker processes and devices."""
        ...


@runtime_checkable
class Preparing(Protocol):
    """An evaluator that can start work on candidates before they are evaluated.

    Runtimes call ``prepare`` with a batch before evaluating its members (the
    sandbox compiles CUDA sources ahead, and a shipped seed's Triton variants' kernels
    for the shapes whose inputs it holds: call it after ``warm_up``); it must return at once and never raise
    for a bad candidate. It may be called while ``evaluate`` runs in another thread
    (the Ray runtime's evaluator actors are threaded, so that a hint does not wait for
    the evaluation under way).
    """

    def prepare(self, candidates: Sequence[Candidate]) -> None: ...


@runtime_checkable
class Warming(Protocol):
    """An evaluator with a set-up to do before its first candidate on a list of shapes.

    Runtimes call ``warm_up`` once per list of shapes, before the first ``evaluate`` on
    it, and wait for it (the sandbox times the baseline, makes the judge's inputs and
    starts its spare processes). It may take long and must not raise for want of a
    candidate. Without it that work falls in the first candidates' time, and on a GPU in
    their figures too: the first candidate of a fresh sandbox evaluator measured 13-27%
    below its later evaluations (an H100, 2026-12-06), so a search's seeds, evaluated
    first, looked slower than they are (that the set-up is the whole cause is not yet
    measured).
    """

    def warm_up(self, shapes: Sequence[str]) -> object: ...


@runtime_checkable
class Concurrent(Protocol):
    """An evaluator whose ``evaluate`` may be called from several threads at once.

    ``concurrent_calls`` is read once, after the evaluator is made: runtimes keep up to
    that many ``evaluate`` calls in flight, each in its own thread, and take results as
    they finish (not necessarily in order). The evaluator decides what may overlap (the
    sandbox lets one candidate's checks run while the next one loads, and clocks neither
    beside the other); ``prepare`` and ``environment`` may be called meanwhile too.
    An evaluator without it is called from one thread, one candidate at a time.
    """

    @property
    def concurrent_calls(self) -> int: ...


def concurrent_calls(evaluator: object) -> int:
    """How many ``evaluate`` calls a runtime may keep in flight on ``evaluator`` (1
    unless it is ``Concurrent``)."""
    if isinstance(evaluator, Concurrent):
        return max(1, int(evaluator.concurrent_calls))
    return 1
