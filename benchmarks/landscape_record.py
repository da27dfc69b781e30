"""Measuring listed points through the judge within a wall-clock budget, and recording them.

The parts of a landscape run that do not depend on what is measured: the budget
(:class:`Budget`: when an evaluation may start and how long it may take), the loop
(:class:`PointRun`: evaluates points in order, compiling the next ones ahead, until
the budget or the points end), the landscape file (:class:`LandscapeFile`: one
``{"candidate", "evaluation", "shapes"}`` line per point, flushed at once, the format
evokernel.evaluate.replay reads), and the CSV rows and figures of one evaluation.
Used by benchmarks/landscape_gpu.py and benchmarks/topk_family_gpu.py.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TextIO

from benchmarks.landscape_points import Point
from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status

log = logging.getLogger(__name__)

LOOKAHEAD = 16
"""Points handed to the judge's background compilers before their turn."""


MIN_LIMIT_S = 1.0
"""No evaluation starts with less time than this."""


class _Timeout(Protocol):
    timeout_s: float


class PointJudge(Protocol):
    """What :class:`PointRun` needs of an evaluator (SandboxEvaluator has it)."""

    @property
    def config(self) -> _Timeout: ...

    def prepare(self, candidates: Sequence[Candidate]) -> None: ...

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation: ...


@dataclass
class Budget:
    """A run's wall-clock budget, counted from ``started``.

    An evaluation gets the full ``timeout_s`` while that fits before ``total_s`` less
    ``reserve_s`` (kept for writing results); after that it gets what is left, but
    only while that is at least twice the median evaluation so far (the first one gets
    what is left, if that is at least ``MIN_LIMIT_S``). An evaluation cut
    short that way is not a measurement of the kernel, so :class:`PointRun` does not
    record it. The judge's limit covers a candidate's checks and timing, not a CUDA
    build done on demand (the reserve absorbs one).
    """

    total_s: float
    timeout_s: float
    reserve_s: float = 10.0
    started: float | None = None
    """The clock's reading at the start (None: now)."""
    clock: Callable[[], float] = time.perf_counter
    walls: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.clock()

    def elapsed(self) -> float:
        assert self.started is not None
        return self.clock() - self.started

    def limit_for_next(self) -> float | None:
        """Seconds the next evaluation may take, or None when no evaluation should start."""
        left = self.total_s - self.reserve_s - self.elapsed()
        if left >= self.timeout_s:
            return self.timeout_s
        if left >= MIN_LIMIT_S and (not self.walls or left >= 2 * statistics.median(self.walls)):
            return left
        return None

    def record(self, wall_s: float) -> None:
        self.walls.append(wall_s)


@dataclass(frozen=True)
class Measured:
    """One point's verdict, with its place in the run."""

    index: int
    point: Point
    evaluation: Evaluation
    wall_s: float
    elapsed_s: float


class PointRun:
    """Evaluates points in order through a judge until the budget or the points end.

    ``stopped`` says why it ended, once :meth:`measure` has returned.
    """

    def __init__(self, judge: PointJudge, shapes: Sequence[str], budget: Budget,
                 lookahead: int = LOOKAHEAD) -> None:
        self.judge = judge
        self.shapes = list(shapes)
        self.budget = budget
        self.lookahead = lookahead
        self.stopped = ""

    def measure(self, points: Iterable[Point]) -> Iterator[Measured]:
        """Each point's verdict, in order; the points are drawn from ``points`` lazily."""
        source = iter(points)
        pending: deque[Point] = deque()
        index = 0
        while True:
            added = []
            while len(pending) < self.lookahead and (point := next(source, None)) is not None:
                pending.append(point)
                added.append(point.candidate)
            if added:
                self.judge.prepare(added)
            if not pending:
                self.stopped = "every listed point measured"
                return
            limit = self.budget.limit_for_next()
            if limit is None:
                self.stopped = f"budget of {self.budget.total_s:.0f} s reached"
                return
            point = pending.popleft()
            self.judge.config.timeout_s = limit
            began = self.budget.clock()
            evaluation = self.judge.evaluate(point.candidate, self.shapes)
            wall = self.budget.clock() - began
            if evaluation.status is Status.TIMEOUT and limit < self.budget.timeout_s:
                self.stopped = (f"budget of {self.budget.total_s:.0f} s reached ({point.label} was cut "
                                f"short at {limit:.0f} s and is not recorded)")
                return
            self.budget.record(wall)
            yield Measured(index, point, evaluation, wall, self.budget.elapsed())
            index += 1


def free_path(path: Path) -> Path:
    """``path``, or ``<stem>-2<suffix>``, ``-3``... where it exists: nothing is overwritten."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


class LandscapeFile:
    """A landscape JSONL being written: one record per measured point, flushed at once,
    so a run cut short keeps every point it measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO = path.open("x", encoding="utf-8")
        self.records = 0

    def add(self, candidate: Candidate, evaluation: Evaluation, shapes: Sequence[str]) -> None:
        self._file.write(json.dumps({
            "candidate": candidate.model_dump(mode="json"),
            "evaluation": evaluation.model_dump(mode="json", exclude={"log"}),
            "shapes": list(shapes),
        }) + "\n")
        self._file.flush()
        self.records += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> LandscapeFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def latency_figures(result: Evaluation) -> dict[str, Any]:
    """Status, passed shapes, the judge's and CUPTI's mean latency (us), speedups.

    The means are over the shapes that passed (all of them only if the status is
    PASSED; the speedups exist only then). CUPTI's mean is given only where CUPTI timed every passed shape (a mean over some
    shapes would not compare with the judge's).
    """
    passed = [s.timing for s in result.shapes if s.timing is not None]
    judge = [t.median_ms * 1e3 for t in passed]
    cupti = [t.cupti_ms * 1e3 for t in passed if t.cupti_ms]
    return {
        "status": result.status.value,
        "passed_shapes": len(passed),
        "mean_latency_us": _mean(judge),
        "mean_latency_us_cupti": _mean(cupti) if cupti and len(cupti) == len(passed) else None,
        "cupti_shapes": len(cupti),
        "mean_speedup": result.mean_speedup,
        "fitness": result.fitness,
    }


def evaluation_rows(fields: Mapping[str, Any], result: Evaluation, axes: Mapping[str, Mapping[str, Any]],
                    per_shape: Callable[[str], Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """CSV rows of one evaluation: one per shape reached, or one saying why none was.

    ``fields`` are the point's own columns (label, candidate, ...); ``axes`` each
    shape's axes; ``per_shape`` adds columns that depend on the shape (a band, say).
    """
    head = {**fields, "status": result.status.value}
    if not result.shapes:
        return [{**head, "message": result.feedback[:300]}]
    rows = []
    for s in result.shapes:
        t = s.timing
        rows.append({
            **head, "shape": s.shape, **(per_shape(s.shape) if per_shape else {}),
            "shape_status": s.status.value, **axes[s.shape],
            "latency_us": t.median_ms * 1e3 if t else None,
            "cupti_us": t.cupti_ms * 1e3 if t and t.cupti_ms else None,
            "cupti_note": t.cupti_note[:120] if t else None,
            "method": t.method if t else None,
            "speedup": s.speedup, "message": s.message[:300],
            "registers": result.resources.get("registers"),
            "shared_bytes": result.resources.get("shared_bytes"),
            "build_s": result.resources.get("build_s"),
        })
    return rows
