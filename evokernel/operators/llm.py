"""LLM operators: mutate, repair, crossover (one request each) and the tool-using agent.

Which of them a run uses, with what weight and options, comes from a preset in
``operators/presets.yaml`` (``LLMConfig.preset``) overridden by ``LLMConfig.operators``;
:func:`make_llm_operators` builds them around one shared :class:`ChatClient`, so
they share the token budget, the concurrency limit and the recording. Children
keep the parent's language, entry point, parameter spaces and values; only the
sources change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Status
from evokernel.llm.bandit import UCB1
from evokernel.llm.client import ChatClient
from evokernel.llm.config import LLMConfig, endpoint_problem
from evokernel.llm.edits import apply_reply
from evokernel.llm.prompts import describe_candidate, describe_evaluation, operators_root, render
from evokernel.operators.base import OperatorContext
from evokernel.operators.llm_agent import LLMAgent
from evokernel.operators.llm_base import (
    Attempt,
    Failed,
    LLMOperator,
    Outcome,
    OutcomeRecord,
    derive,
)
from evokernel.registry import Registry

__all__ = [
    "LLMAgent", "LLMConfig", "LLMCrossover", "LLMMutate", "LLMOperator", "LLMRepair",
    "Outcome", "OutcomeRecord", "endpoint_problem", "llm_unavailable", "make_llm_operators",
    "operator_weights",
]

REPAIRABLE = {Status.BUILD_FAILED, Status.RUNTIME_ERROR, Status.INCORRECT, Status.TIMEOUT, Status.REJECTED}


class LLMMutate(LLMOperator):
    """Arity 1: a rewrite of the parent informed by its evaluation (whole files or diffs)."""

    name = "mutate"
    arity = 1
    spec_options: ClassVar[tuple[str, ...]] = ("hint",)

    def __init__(self, client: ChatClient, name: str | None = None, *, hint: str = "", **options: Any) -> None:
        super().__init__(client, name, **options)
        self.hint = hint

    def _propose(
        self, parents: Sequence[Candidate], ctx: OperatorContext, attempt: Attempt
    ) -> tuple[Candidate, str]:
        (parent,) = parents
        prompt = render(
            "mutate", workload=self._brief(ctx), candidate=describe_candidate(parent),
            evaluation=describe_evaluation(self._evaluation(ctx, 0), ctx.floor_ms),
            hint=self.hint, format=self._format(),
        )
        return self._one_shot(parent, prompt, ctx, attempt)

    def _one_shot(self, base: Candidate, prompt: str, ctx: OperatorContext, attempt: Attempt,
                  parents: tuple[str, ...] | None = None) -> tuple[Candidate, str]:
        messages = [{"role": "system", "content": render("system")}, {"role": "user", "content": prompt}]
        reply = self._ask(messages, ctx, attempt)
        sources = apply_reply(reply.content, base.sources, base.entry_point)
        child = derive(base, sources, self.name, ctx, parents)
        return child, f"{len(reply.content)} chars, finish={reply.finish_reason}"


class LLMRepair(LLMMutate):
    """Arity 1: a fix of a candidate that failed, from its error feedback."""

    name = "repair"

    def _propose(
        self, parents: Sequence[Candidate], ctx: OperatorContext, attempt: Attempt
    ) -> tuple[Candidate, str]:
        (parent,) = parents
        evaluation = self._evaluation(ctx, 0)
        if evaluation is None or evaluation.status not in REPAIRABLE:
            status = "no evaluation" if evaluation is None else evaluation.status.value
            raise Failed(Outcome.NOT_APPLICABLE, f"repair needs a failed parent ({status})")
        prompt = render(
            "repair", workload=self._brief(ctx), candidate=describe_candidate(parent),
            evaluation=describe_evaluation(evaluation), format=self._format(),
        )
        return self._one_shot(parent, prompt, ctx, attempt)


class LLMCrossover(LLMMutate):
    """Arity 2: a child of the fitter parent that borrows the other's best idea."""

    name = "crossover"
    arity = 2

    def _propose(
        self, parents: Sequence[Candidate], ctx: OperatorContext, attempt: Attempt
    ) -> tuple[Candidate, str]:
        a, b = parents
        ea, eb = self._evaluation(ctx, 0), self._evaluation(ctx, 1)
        if a.code_id == b.code_id:
            raise Failed(Outcome.NOT_APPLICABLE, "the parents share their code: knob crossover covers that")
        if ea is not None and eb is not None and eb.rank_key() > ea.rank_key():
            a, b, ea, eb = b, a, eb, ea
        floor = ctx.floor_ms
        prompt = render(
            "crossover", workload=self._brief(ctx),
            candidate_a=describe_candidate(a), evaluation_a=describe_evaluation(ea, floor),
            candidate_b=describe_candidate(b), evaluation_b=describe_evaluation(eb, floor),
            format=self._format(),
        )
        return self._one_shot(a, prompt, ctx, attempt, parents=(a.id, b.id))


# -- presets and the factory ------------------------------------------------------------

LLM_KINDS: Registry[type[LLMOperator]] = Registry("LLM operator kind")
"""Preset entries name their class by ``kind``; a new LLM operator is an ``LLMOperator``
subclass plus ``LLM_KINDS.register("kind", Class)``."""
for _kind, _cls in (("mutate", LLMMutate), ("repair", LLMRepair), ("crossover", LLMCrossover),
                    ("agent", LLMAgent)):
    LLM_KINDS.register(_kind, _cls)


class OperatorSpec(BaseModel):
    """One entry of a preset: which operator class, its weight and its options."""

    model_config = ConfigDict(extra="forbid")

    kind: str | None = None
    """A name in ``LLM_KINDS`` (default: the entry's own name)."""
    weight: float = Field(default=1.0, ge=0)
    diff: bool = False
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    """Tokens per reply (default: llm.max_tokens)."""
    hint: str = ""
    """mutate only: an extra instruction appended to the task."""
    max_turns: int = Field(default=6, ge=1)
    """agent only, like the next two."""
    token_limit: int = Field(default=60_000, ge=1)
    max_evaluations: int = Field(default=6, ge=0)


def load_presets(root: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    path = (root or operators_root()) / "presets.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must map preset names to operator entries")
    return data


def operator_specs(config: LLMConfig, root: Path | None = None) -> dict[str, OperatorSpec]:
    """The preset merged with the config's overrides, filtered by ``diff_mode`` and weight."""
    presets = load_presets(root)
    if config.preset not in presets:
        raise ValueError(f"llm.preset {config.preset!r} is not one of {sorted(presets)}")
    entries = {name: dict(opts or {}) for name, opts in presets[config.preset].items()}
    for name, over in config.operators.items():
        entries[name] = {**entries.get(name, {}), **over}
    specs: dict[str, OperatorSpec] = {}
    for name, opts in entries.items():
        try:
            spec = OperatorSpec.model_validate(opts)
        except ValidationError as exc:
            raise ValueError(f"llm operator {name!r}: {exc.errors()[0]['msg']} ({exc.errors()[0]['loc']})") from None
        kind = spec.kind or name
        if kind not in LLM_KINDS:
            raise ValueError(f"llm operator {name!r}: unknown kind {kind!r}; give kind: one of {LLM_KINDS.names()}")
        spec = spec.model_copy(update={"kind": kind})
        if kind == "mutate" and config.diff_mode != "both" and spec.diff != (config.diff_mode == "diff"):
            continue
        if spec.weight > 0:
            specs[name] = spec
    return specs


def make_llm_operators(
    config: LLMConfig,
    run_dir: str | Path | None = None,
    *,
    client: ChatClient | None = None,
    brief: str = "",
    environ: Mapping[str, str] | None = None,
) -> list[LLMOperator]:
    """The configured LLM operators around one client (made here unless given).

    ``brief`` describes the workload for the prompts (see ``prompts.workload_brief``);
    ``ctx.workload_brief`` overrides it per call.
    """
    client = client or ChatClient(config, run_dir, environ=environ)
    bandit = UCB1(client.models) if len(client.models) > 1 else None
    ops: list[LLMOperator] = []
    for name, spec in operator_specs(config).items():
        common: dict[str, Any] = {
            "weight": spec.weight, "diff": spec.diff, "temperature": spec.temperature,
            "max_tokens": spec.max_tokens, "brief": brief, "bandit": bandit,
        }
        cls = LLM_KINDS.get(str(spec.kind))
        ops.append(cls(client, name, **{k: getattr(spec, k) for k in cls.spec_options}, **common))
    return ops


def operator_weights(ops: Sequence[LLMOperator]) -> dict[str, float]:
    """Selection weights by operator name, normalised to sum to 1."""
    total = sum(op.weight for op in ops) or 1.0
    return {op.name: op.weight / total for op in ops}


def llm_unavailable(config: LLMConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """None when the LLM operators can run; else a message saying how to configure them,
    ending with what happens next (built-ins only, or stop) per ``fallback_to_builtin``."""
    problem = endpoint_problem(config, environ)
    if problem is None:
        return None
    tail = ("Continuing with the built-in operators only (llm.fallback_to_builtin: true)."
            if config.fallback_to_builtin else "Stopping: llm.fallback_to_builtin is false.")
    return f"{problem}\n{tail}"
