"""The Operator protocol: what every variation operator, built-in or LLM, implements.

Operators are pure proposers: they read parents and a context and return new
candidates. They never evaluate, never touch a population and never change their
parents (candidates are frozen; children come from ``Candidate.with_params`` or a
fresh ``Candidate``), so a strategy can call any of them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation


@runtime_checkable
class LLMClient(Protocol):
    """Placeholder for the LLM client the LLM operators will use (unused by built-ins)."""

    def complete(self, prompt: str, **kwargs: Any) -> str: ...


@dataclass
class OperatorContext:
    """Everything an operator may consult besides its parents.

    ``rng`` is the only source of randomness an operator may use, so that a run
    is reproducible from its seed and resumable from its saved RNG state.
    """

    rng: np.random.Generator
    workload: str
    budget_left: float
    """Evaluations (or device seconds) the run has left; LLM operators may scale effort."""
    evaluations: Sequence[Evaluation | None] = ()
    """The parents' evaluations, in parent order (None where unknown)."""
    generation: int = 0
    llm: LLMClient | Any | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Operator(Protocol):
    """Proposes children from ``arity`` parents. May return no child (nothing to vary)."""

    name: str
    arity: int

    def propose(self, parents: Sequence[Candidate], ctx: OperatorContext) -> list[Candidate]: ...
