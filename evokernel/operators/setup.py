"""The operator side of building a run: which strategy and operator mix a config may use,
whether its LLM operators can run, and the services (LLM operators, the agent's
evaluations, the outcome journal) a strategy's operators get.

Used by the run builder (``evokernel.run``) for every run, and by compare once for
the whole comparison, so that all its runs use the same endpoint and recording.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evokernel.candidate import Candidate
from evokernel.config import ConfigError, RunConfig
from evokernel.evaluate.result import Evaluation
from evokernel.journal import RunDir
from evokernel.llm.outcomes import OutcomeLog
from evokernel.runtime import Runtime
from evokernel.strategies import STRATEGIES, RunServices, strategy_class

logger = logging.getLogger(__name__)


class LLMUnavailable(ConfigError):
    """The LLM operators cannot run and ``llm.fallback_to_builtin`` is off; the message
    says how to configure an endpoint."""


def check(config: RunConfig) -> None:
    """One-line errors for a strategy or operator mix that cannot work."""
    try:
        cls = strategy_class(config.strategy)
    except ValueError as exc:
        raise ConfigError(f"strategy: {exc}") from None
    ops = config.operators
    if ops.kind == "builtin" and not ops.rates:
        return
    if not cls.uses_operators:
        users = [n for n in STRATEGIES.names() if STRATEGIES.get(n).uses_operators]
        what = f"operators.kind {ops.kind!r}" if ops.kind != "builtin" else "operators.rates"
        named = " or ".join(users) if len(users) < 3 else f"{', '.join(users[:-1])} or {users[-1]}"
        raise ConfigError(f"{what} needs strategy {named}, not {config.strategy!r}")
    from evokernel.operators.llm import load_presets
    from evokernel.strategies.mixing import known_rates

    try:
        presets = load_presets()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"llm.preset: {str(exc).splitlines()[0]}") from None
    if config.llm.preset not in presets:
        raise ConfigError(f"llm.preset {config.llm.preset!r} is not one of {sorted(presets)}")
    llm_names = [] if ops.kind == "builtin" else sorted({*(presets[config.llm.preset] or {}), *config.llm.operators})
    names = known_rates(llm_names)
    unknown = sorted(set(ops.rates) - set(names))
    if unknown:
        raise ConfigError(f"operators.rates: unknown operator {unknown[0]!r}; known: {', '.join(names)}")


def llm_problem(config: RunConfig, run_root: Path | None = None) -> str | None:
    """Why the configured LLM operators cannot run (how to fix it), or None if they can
    or none are configured. A replay without a recording is a ``ConfigError``."""
    if config.operators.kind == "builtin":
        return None
    from evokernel.operators.llm import llm_unavailable

    problem = llm_unavailable(config.llm)
    if problem is None and config.llm.mode == "replay":
        folder = config.llm.recordings(run_root)
        if folder is None or not folder.is_dir():
            raise ConfigError(f"--llm replay: no recording at {folder or '(none)'}; point "
                              "llm.recording_dir at a recorded run's llm/ folder")
    return problem


def with_llm_decided(config: RunConfig) -> tuple[RunConfig, str | None]:
    """A new run's config with the LLM question settled: the endpoint and models the
    environment gives fixed in it (never the key), or, when no endpoint is configured,
    the built-in operators instead (``LLMUnavailable`` if fallback is off). Returns the
    config and the notice to show (None: nothing to say)."""
    check(config)
    problem = llm_problem(config)
    if problem is None:
        if config.operators.kind != "builtin":
            config = config.model_copy(update={"llm": config.llm.resolved()})
        return config, None
    if not config.llm.fallback_to_builtin:
        raise LLMUnavailable(problem)
    operators = config.operators.model_copy(update={"kind": "builtin"})
    return config.model_copy(update={"operators": operators}), problem


def llm_services(config: RunConfig, directory: RunDir, workload: Any, shapes: Sequence[str],
                 runtime: Runtime) -> RunServices:
    """The LLM operators and what they need: the agent's evaluations (by the run's
    evaluators, journaled with the outcome, not charged) and the outcome journal."""
    from evokernel.llm.prompts import workload_brief
    from evokernel.operators.llm import make_llm_operators

    brief = workload_brief(workload)
    try:
        ops = make_llm_operators(config.llm, directory.root, brief=brief)
        agent_shapes = (list(workload.resolve_shapes(config.operators.agent_shapes))
                        if config.operators.agent_shapes else list(shapes))
    except (ValueError, KeyError) as exc:
        raise ConfigError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None

    def evaluate(candidate: Candidate, on: Sequence[str]) -> Evaluation:
        for _, evaluation in runtime.evaluate([candidate], list(on)):
            return evaluation
        raise RuntimeError("the runtime returned no evaluation")

    log = OutcomeLog(directory.llm_outcomes_path)

    def journal(record: Any, generation: int, agent_evaluations: Any) -> None:
        log.append(generation, record.to_json(), agent_evaluations)

    logger.info("LLM operators %s (%s mode, models %s)", ", ".join(op.name for op in ops), config.llm.mode,
                ", ".join(ops[0].client.models) if ops else "-")
    return RunServices(llm_operators=ops, evaluate=evaluate, agent_shapes=agent_shapes,
                       workload_brief=brief, on_llm_outcome=journal)
