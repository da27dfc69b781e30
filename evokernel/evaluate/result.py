"""What an evaluation says about a candidate.

Timing exists only for a candidate that passed correctness on every shape it was
run on; the validators enforce it, so no code path can hand a fitness to a wrong
kernel by accident.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Status(str, Enum):
    """Outcome of an evaluation, in the order the cascade reaches them."""

    BUILD_FAILED = "BUILD_FAILED"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    INCORRECT = "INCORRECT"
    REJECTED = "REJECTED"
    """Passed the checks but broke a rule (forbidden call, impossible speed, ...)."""
    SKIPPED = "SKIPPED"
    """Built, but this machine cannot run it (a CUDA kernel on a machine with no GPU)."""
    PASSED = "PASSED"

    @property
    def rank(self) -> int:
        """How far the cascade got: failures that got further rank higher."""
        return _RANK[self]


_RANK = {
    Status.BUILD_FAILED: 0,
    Status.TIMEOUT: 1,
    Status.RUNTIME_ERROR: 1,
    Status.SKIPPED: 2,
    Status.INCORRECT: 2,
    Status.REJECTED: 3,
    Status.PASSED: 4,
}


class Timing(BaseModel):
    """Latency of one callable on one shape, over trials and rotating input sets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    median_ms: float = Field(gt=0)
    """The figure that counts: time per call by the judge's own clock over batches of
    calls on fresh inputs (median over batches); see evaluate/judge.py."""
    p25_ms: float
    p75_ms: float
    """The fastest and slowest batch's time per call (older records: quartiles)."""
    e2e_ms: float = Field(gt=0)
    """One checked call as the judge saw it: request to reply, round trip included."""
    samples: int = Field(ge=1)
    method: str
    """``judge-graph`` (batch replayed as one CUDA graph), ``judge-eager`` or ``judge-cpu``;
    records from before the judge: ``cuda-graph``, ``cuda-sync-wallclock``, ``cpu-wallclock``."""
    cupti_ms: float | None = None
    """FlashInfer-Bench's figure: median CUPTI kernel span of one eager call on a cold L2,
    measured in the candidate's process and kept only where it agrees with the judge."""
    cupti_note: str = ""
    """Why there is no CUPTI figure (unavailable, or not believed)."""


class ShapeResult(BaseModel):
    """One shape of one candidate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: str
    status: Status
    message: str = ""
    timing: Timing | None = None
    reference: Timing | None = None
    """The baseline's timing on this shape, measured in the same run by the same method."""
    baseline: str = ""
    """Which reference ``reference`` timed: ``published`` (the definition's, as
    FlashInfer-Bench runs it) or ``own`` (ours, where the published one is not configured)."""
    stats: dict[str, float] = Field(default_factory=dict)
    """Checker statistics: the largest absolute and relative errors (``max_abs_error``,
    ``max_rel_error``) over the outputs checked together, where every check passed; on a
    failure, the failing check's. Judge diagnostics (``phase_*_ms`` and others) beside them."""

    @model_validator(mode="after")
    def _timing_only_when_passed(self) -> ShapeResult:
        if self.status is not Status.PASSED and self.timing is not None:
            raise ValueError(f"shape {self.shape}: timing given for status {self.status.value}")
        return self

    @property
    def speedup(self) -> float | None:
        if self.timing is None or self.reference is None:
            return None
        return self.reference.median_ms / self.timing.median_ms

    @property
    def speedup_cupti(self) -> float | None:
        """Speedup by CUPTI spans (the FlashInfer-Bench method), where both sides have one."""
        if self.timing is None or self.reference is None:
            return None
        if self.timing.cupti_ms is None or self.reference.cupti_ms is None:
            return None
        return self.reference.cupti_ms / self.timing.cupti_ms


class Evaluation(BaseModel):
    """The verdict on one candidate over a set of shapes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_id: str
    status: Status
    shapes: tuple[ShapeResult, ...] = ()
    feedback: str = ""
    """Short text for LLM operators: compiler errors, first mismatch, timings."""
    log: str = ""
    environment: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, float] = Field(default_factory=dict)
    """Static build facts (registers, shared memory, spills) when the build reports them."""
    wall_s: float = 0.0
    device_s: float = 0.0
    """Seconds the candidate kept the device busy (build excluded)."""
    overheads: dict[str, float] = Field(default_factory=dict)
    """Where the wall time went besides the shapes (seconds): waiting for a process,
    loading the candidate, mapping inputs, retiring the process. Diagnosis only."""

    @model_validator(mode="after")
    def _passed_means_all_passed(self) -> Evaluation:
        # Per-shape timing exists only for shapes that passed (ShapeResult enforces it);
        # a candidate passes, and so has a fitness, only if every shape passed.
        if self.status is Status.PASSED:
            if not self.shapes:
                raise ValueError("a PASSED evaluation needs at least one shape")
            bad = [s.shape for s in self.shapes if s.status is not Status.PASSED or s.timing is None]
            if bad:
                raise ValueError(f"PASSED evaluation with failed or untimed shapes {bad}")
        elif self.shapes and all(s.status is Status.PASSED for s in self.shapes):
            raise ValueError(f"every shape passed but the evaluation says {self.status.value}")
        return self

    @property
    def speedups(self) -> dict[str, float]:
        return {s.shape: sp for s in self.shapes if (sp := s.speedup) is not None}

    @property
    def fitness(self) -> float | None:
        """Geometric-mean speedup over the reference, or None unless every shape passed."""
        if self.status is not Status.PASSED:
            return None
        values = list(self.speedups.values())
        if len(values) != len(self.shapes):
            return None
        return math.exp(sum(math.log(v) for v in values) / len(values))

    @property
    def mean_speedup(self) -> float | None:
        """Arithmetic mean of per-shape speedups (the contest's aggregate)."""
        if self.fitness is None:
            return None
        values = list(self.speedups.values())
        return sum(values) / len(values)

    def rank_key(self) -> tuple[int, float]:
        """Total order: passing above failing, then by fitness; failures by stage."""
        return (self.status.rank, self.fitness or 0.0)

    def summary(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate_id,
            "status": self.status.value,
            "fitness": self.fitness,
            "mean_speedup": self.mean_speedup,
        }
