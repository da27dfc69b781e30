"""The Operator protocol and its context: what every variation operator, built-in or LLM, implements.

Operators are pure proposers: they read parents and a context and return new
candidates. They never evaluate (except through the context's ``evaluate``, which
the agent uses as a tool), never touch a population and never change their
parents (candidates are frozen; children come from ``Candidate.with_params`` or a
fresh ``Candidate``), so a strategy can call any of them the same way.

A new operator is one file plus one registration::

    from evokernel.operators import OPERATORS
    OPERATORS.register("knob_reset", KnobReset)     # KnobReset() -> Operator

after which ``operators.rates.knob_reset`` gives it a share of the children of any
strategy that draws operators (``operators.kind: mixed``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation

if TYPE_CHECKING:
    from evokernel.operators.llm_base import OutcomeRecord

Evaluate = Callable[[Candidate, Sequence[str]], Evaluation]


@dataclass
class OperatorContext:
    """Everything an operator may consult besides its parents; built by the strategy
    for each proposal.

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
    workload_brief: str = ""
    """The workload in a paragraph, for prompts (empty: the operator's own)."""
    floor_ms: Mapping[str, float] | None = None
    """Per-shape latency floors, where the workload knows them (for feedback)."""
    evaluate: Evaluate | None = None
    """Evaluate a draft now, outside the budget (the agent's tools); None: not offered."""
    agent_shapes: Sequence[str] = ()
    """The shapes ``evaluate`` runs on."""
    on_outcome: Callable[[OutcomeRecord], None] | None = None
    """Called once per LLM proposal with its outcome record (the run journals it)."""


@runtime_checkable
class Operator(Protocol):
    """Proposes children from ``arity`` parents.

    ``propose`` is called by a strategy when it fills a child slot, with exactly
    ``arity`` parents (already evaluated, or seeds) and a fresh context. It may
    return no child (nothing to vary, a reply without usable code); it must not
    raise for a bad parent or a bad reply, and must draw randomness from
    ``ctx.rng`` only. A child that repeats a candidate already seen is allowed:
    the strategy decides whether to try again.
    """

    name: str
    """The operator's name: journaled as each child's ``operator``, and the key of
    its rate in ``operators.rates``."""
    arity: int

    def propose(self, parents: Sequence[Candidate], ctx: OperatorContext) -> list[Candidate]: ...
