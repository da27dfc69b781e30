"""The Strategy base class: what the engine calls, when, and what a strategy may assume.

The engine loop is the same for every strategy, so a comparison between two
strategies at equal budget differs only in what ``ask`` proposes. A new strategy
subclasses :class:`Strategy`, implements ``ask`` (and usually ``tell`` and
``state``), and is registered by name (``STRATEGIES.register("name", Class)`` in
``evokernel.strategies``); nothing else in evokernel needs to change.

The order of calls the engine guarantees, for a run with lookahead ``L`` (0: every
generation is told before the next is asked; 1: pipelined, the next generation is
asked while the current one is evaluated)::

    Strategy(env, **options)          or  Strategy.from_state(state, env) on resume
    tell(seed, evaluation) ...        generation 0: the seeds, in order
    on_generation_end(0)
    on_budget(left); ask(n)           generation g >= 1, once g - 1 - L (and 0) has been told
    tell(c, evaluation) ...           every candidate of generation g, in the order asked
    on_generation_end(g)
    state()                           after on_generation_end: the snapshot of generation g

A strategy is plain Python; its whole decision state (RNG included) is in
``state()``, and ``from_state(state, env)`` rebuilds it exactly, so a resumed run
asks what the uninterrupted run would have asked.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.populations import EliteArchive, Entry, Host, in_process

if TYPE_CHECKING:
    from evokernel.config import RunConfig
    from evokernel.operators.llm_base import LLMOperator, OutcomeRecord

OutcomeSink = Callable[["OutcomeRecord", int, Mapping[str, Evaluation]], None]
"""``(record, generation, agent_evaluations)``: one call per LLM proposal."""


@dataclass
class RunServices:
    """What the run offers a strategy's operators beyond the candidates themselves.

    The run builder fills it on a new run and on resume alike: LLM operators hold
    sockets and threads, so they are rebuilt from the run config, never pickled
    into a snapshot. Everything is optional; built-in operators use none of it.
    """

    llm_operators: Sequence[LLMOperator] = ()
    evaluation_of: Callable[[str], Evaluation | None] | None = None
    """``candidate id -> Evaluation`` of this run (the parents' evaluations, for prompts)."""
    evaluate: Callable[[Candidate, Sequence[str]], Evaluation] | None = None
    """Evaluate a candidate now, outside the budget (the agent's tools)."""
    agent_shapes: Sequence[str] = ()
    """The shapes ``evaluate`` is called on by the agent."""
    workload_brief: str = ""
    floor_ms: Mapping[str, float] | None = None
    """Per-shape latency floors, for feedback (None: not known)."""
    on_llm_outcome: OutcomeSink | None = None


@dataclass
class StrategyEnv:
    """What a strategy is built from besides its own options."""

    seeds: Sequence[Candidate]
    seed: int = 0
    workload: str = ""
    host: Host = in_process
    """Where populations live: in process, or in Ray actors (see ``runtime.py``)."""
    run_dir: Path | None = None
    """Where Optuna storages go (``<run>/optuna``); None keeps studies in memory."""
    services: RunServices = field(default_factory=RunServices)


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    return dict(rng.bit_generator.state)


def rng_from_state(state: dict[str, Any]) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng


class Strategy(abc.ABC):
    """Base class of every search strategy: proposes candidates, learns from evaluations.

    It keeps what every strategy needs: a seeded RNG (``self.rng``, the only source
    of randomness a strategy may use), the seeds, a generation counter, an elite
    archive of everything told and the set of ids seen. Subclasses set ``name``
    (the registry name) and implement :meth:`ask`.
    """

    name: ClassVar[str] = "base"
    uses_operators: ClassVar[bool] = False
    """True if the strategy draws variation operators, so that ``operators.kind`` of
    ``llm`` or ``mixed`` applies to it (the run builder refuses it otherwise)."""

    def __init__(self, env: StrategyEnv, archive_size: int = 10) -> None:
        if not env.seeds:
            raise ValueError("a strategy needs at least one seed candidate")
        self.env = env
        self.seeds = list(env.seeds)
        self.rng = np.random.default_rng(env.seed)
        self.generation = 0
        self.budget_left = float("inf")
        self.archive = EliteArchive(archive_size)
        self.seen: set[str] = set()

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def options_from(cls, config: RunConfig) -> dict[str, Any]:
        """Constructor keyword arguments read from a run config (its own section).

        Called once by the run builder for a new run; ``config.strategy_options`` is
        merged over the result. The default reads nothing.
        """
        return {}

    @classmethod
    def from_state(cls, state: dict[str, Any], env: StrategyEnv) -> Strategy:
        """Rebuild a strategy from :meth:`state` (on resume, in any process).

        ``env`` equals the original run's (same seeds and seed; services rebuilt).
        The default calls ``cls(env, **state["options"])`` then :meth:`load_state`.
        """
        obj = cls(env, **dict(state.get("options") or {}))
        obj.load_state(state)
        return obj

    # -- the loop ---------------------------------------------------------------------------
    @abc.abstractmethod
    def ask(self, n: int) -> list[Candidate]:
        """Propose up to ``n`` (>= 1) candidates: one generation.

        Called once per generation g >= 1, after :meth:`on_budget`, when every generation
        up to ``max(0, g - 1 - L)`` has been told (``L``: the run's lookahead) and none
        after it, so the seeds are always known first.
        May return fewer (a space nearly exhausted) and may repeat a candidate
        evaluated before: a repeat costs no budget and is told again. Returning
        nothing for ``max_stall`` generations in a row ends the run.
        """

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        """Learn one evaluation: each asked candidate (and each seed) once, in the order
        asked, a generation at a time. The default records it in the archive."""
        self._tell_common(candidate, evaluation)

    # -- optional hooks (empty by default) --------------------------------------------------
    def on_generation_end(self, generation: int) -> None:
        """Called after the last ``tell`` of ``generation`` and before its snapshot."""
        return None

    def on_budget(self, left: float) -> None:
        """Called before each ``ask`` with the budget left after what is already
        committed (evaluations, or device seconds for a device-second budget)."""
        self.budget_left = left

    # -- results and state ------------------------------------------------------------------
    def best(self) -> Entry | None:
        return self.archive.best()

    def state(self) -> dict[str, Any]:
        """Everything that decides future asks, as JSON-able data (the snapshot's part).

        Called after each generation's ``on_generation_end``. Subclasses extend the
        base state: ``{**super().state(), ...}``.
        """
        return self._base_state()

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved into an object just built by ``from_state``."""
        self._load_base(state)

    def _tell_common(self, candidate: Candidate, evaluation: Evaluation) -> None:
        self.archive.add(candidate, evaluation)
        self.seen.add(candidate.id)

    def _base_state(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "rng": rng_state(self.rng),
            "generation": self.generation,
            "archive": self.archive.state(),
            "seen": sorted(self.seen),
        }

    def _load_base(self, state: dict[str, Any]) -> None:
        if state.get("strategy") != self.name:
            raise ValueError(f"snapshot is of strategy {state.get('strategy')!r}, not {self.name!r}")
        self.rng = rng_from_state(state["rng"])
        self.generation = state["generation"]
        self.archive = EliteArchive.from_state(state["archive"])
        self.seen = set(state["seen"])


def operator_options(config: RunConfig) -> dict[str, Any]:
    """The ``operators`` option of a strategy that draws operators: present only when the
    run mixes operators by rate (LLM operators, or rates given), so plain built-in runs
    keep their old options and state."""
    if config.operators.kind == "builtin" and not config.operators.rates:
        return {}
    return {"operators": config.operators.strategy_options()}
