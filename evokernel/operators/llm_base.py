"""What every LLM operator shares: asking the model, making a child, recording the outcome.

``propose`` never raises. A request that gets no reply, a reply with no usable
code, a diff that does not apply: each yields no child and one
:class:`OutcomeRecord` with a stable ``outcome`` code, counted on the operator
(``outcomes``) and passed to ``ctx.on_outcome`` when the strategy or
the journal wants to see them.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.llm.bandit import UCB1
from evokernel.llm.client import ChatClient, ChatReply, Message
from evokernel.llm.edits import EditError
from evokernel.llm.errors import LLMError
from evokernel.llm.prompts import render
from evokernel.operators.base import OperatorContext

HISTORY = 1000
"""Outcome records an operator keeps in memory (the counters keep everything)."""


class Outcome(str, Enum):
    CHILD = "child"
    NO_CODE = "no_code"
    TRUNCATED = "truncated"
    DIFF_NOT_APPLIED = "diff_not_applied"
    INVALID_CODE = "invalid_code"
    INVALID_CANDIDATE = "invalid_candidate"
    UNCHANGED = "unchanged"
    NOT_APPLICABLE = "not_applicable"
    BUDGET_SPENT = "budget_spent"
    NOT_RECORDED = "not_recorded"
    ENDPOINT_ERROR = "endpoint_error"
    MALFORMED_REPLY = "malformed_reply"
    LLM_ERROR = "llm_error"
    INTERNAL_ERROR = "internal_error"

    @classmethod
    def of(cls, reason: str) -> Outcome:
        try:
            return cls(reason)
        except ValueError:
            return cls.LLM_ERROR


@dataclass(frozen=True)
class OutcomeRecord:
    operator: str
    outcome: Outcome
    detail: str = ""
    parents: tuple[str, ...] = ()
    child: str | None = None
    requests: tuple[str, ...] = ()
    """Recording keys of the requests this proposal made."""
    tokens: int = 0
    model: str = ""
    evaluations: int = 0
    """Evaluations the operator itself ran (the agent's tools)."""

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "outcome": self.outcome.value}


class Failed(Exception):
    """Internal: a proposal that ends with no child, for this outcome."""

    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


@dataclass
class Attempt:
    """What one ``propose`` call has done so far."""

    replies: list[ChatReply] = field(default_factory=list)
    model: str = ""
    evaluations: int = 0

    @property
    def tokens(self) -> int:
        return sum(r.usage.total for r in self.replies)


def derive(parent: Candidate, sources: dict[str, str], operator: str, ctx: OperatorContext,
           parents: tuple[str, ...] | None = None) -> Candidate:
    """A child with new sources and the parent's language, spaces and values."""
    try:
        child = Candidate.model_validate({
            **parent.model_dump(), "sources": sources, "operator": operator,
            "parents": parents or (parent.id,), "generation": ctx.generation,
        })
    except ValueError as exc:
        raise Failed(Outcome.INVALID_CANDIDATE, str(exc).splitlines()[0]) from exc
    if child.code_id == parent.code_id:
        raise Failed(Outcome.UNCHANGED, "the reply leaves the code as it was")
    return child


class LLMOperator:
    """Base of the LLM operators; subclasses implement ``_propose``."""

    name: str = "llm"
    arity: int = 1
    spec_options: ClassVar[tuple[str, ...]] = ()
    """Fields of a preset entry (``OperatorSpec``) passed to this class's constructor
    beyond the common ones (weight, diff, temperature, max_tokens)."""

    def __init__(
        self,
        client: ChatClient,
        name: str | None = None,
        *,
        weight: float = 1.0,
        diff: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        brief: str = "",
        bandit: UCB1 | None = None,
    ) -> None:
        self.client = client
        if name is not None:
            self.name = name
        self.weight = weight
        self.diff = diff
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.brief = brief
        self.bandit = bandit
        self.outcomes: Counter[str] = Counter()
        self.history: list[OutcomeRecord] = []

    @property
    def available(self) -> bool:
        """False once the run's token budget is spent: a strategy should stop choosing it."""
        return not self.client.budget.spent

    # -- the protocol ---------------------------------------------------------------
    def propose(self, parents: Sequence[Candidate], ctx: OperatorContext) -> list[Candidate]:
        attempt = Attempt()
        child: Candidate | None = None
        detail = ""
        try:
            if len(parents) != self.arity:
                raise Failed(Outcome.NOT_APPLICABLE, f"needs {self.arity} parent(s), got {len(parents)}")
            child, detail = self._propose(parents, ctx, attempt)
            outcome = Outcome.CHILD
        except Failed as exc:
            outcome, detail = exc.outcome, str(exc)
        except LLMError as exc:
            outcome, detail = Outcome.of(exc.reason), str(exc)
        except EditError as exc:
            outcome, detail = Outcome.of(exc.reason), str(exc)
        except Exception as exc:  # a bug here must cost one proposal, never the run
            outcome = Outcome.INTERNAL_ERROR
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self._record(ctx, OutcomeRecord(
            operator=self.name, outcome=outcome, detail=detail[:500],
            parents=tuple(p.id for p in parents), child=None if child is None else child.id,
            requests=tuple(r.key for r in attempt.replies), tokens=attempt.tokens,
            model=attempt.model, evaluations=attempt.evaluations,
        ))
        if self.bandit is not None and attempt.model:
            self.bandit.update(attempt.model, 1.0 if child is not None else 0.0)
        return [] if child is None else [child]

    def _propose(
        self, parents: Sequence[Candidate], ctx: OperatorContext, attempt: Attempt
    ) -> tuple[Candidate, str]:
        raise NotImplementedError

    # -- helpers for subclasses -----------------------------------------------------
    def _brief(self, ctx: OperatorContext) -> str:
        return ctx.workload_brief or self.brief or f"workload {ctx.workload}"

    def _evaluation(self, ctx: OperatorContext, i: int) -> Evaluation | None:
        return ctx.evaluations[i] if i < len(ctx.evaluations) else None

    def _format(self) -> str:
        return render("format_diff" if self.diff else "format_full")

    def _ask(
        self,
        messages: Sequence[Message],
        ctx: OperatorContext,
        attempt: Attempt,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> ChatReply:
        if not attempt.model:
            attempt.model = self.bandit.choose() if self.bandit is not None else self.client.models[0]
        reply = self.client.chat(
            messages, model=attempt.model, tools=tools,
            temperature=self.temperature, max_tokens=max_tokens or self.max_tokens,
            seed=int(ctx.rng.integers(2**31 - 1)),
        )
        attempt.replies.append(reply)
        return reply

    def _record(self, ctx: OperatorContext, record: OutcomeRecord) -> None:
        self.outcomes[record.outcome.value] += 1
        self.history.append(record)
        del self.history[:-HISTORY]
        if ctx.on_outcome is not None:
            ctx.on_outcome(record)
