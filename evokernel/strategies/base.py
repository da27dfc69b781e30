"""The Strategy protocol (ask/tell) and what every strategy shares.

The engine loop is the same for every strategy, so a comparison between two
strategies at equal budget differs only in what ``ask`` proposes. A strategy is
plain Python; its whole decision state (RNG included) is in ``state()``, and
``from_state(state, env)`` rebuilds it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.populations import EliteArchive, Entry, Host, in_process


@runtime_checkable
class Strategy(Protocol):
    """Proposes candidates and learns from their evaluations."""

    name: ClassVar[str]
    budget_left: float
    """Set by the engine before each ``ask`` (evaluations or device seconds left)."""

    def ask(self, n: int) -> list[Candidate]: ...

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None: ...

    def best(self) -> Entry | None: ...

    def state(self) -> dict[str, Any]: ...


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
    extra: dict[str, Any] = field(default_factory=dict)


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    return dict(rng.bit_generator.state)


def rng_from_state(state: dict[str, Any]) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng


class BaseStrategy:
    """Keeps the RNG, the generation counter and an elite archive of everything told."""

    name: ClassVar[str] = "base"

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

    def ask(self, n: int) -> list[Candidate]:
        raise NotImplementedError

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def best(self) -> Entry | None:
        return self.archive.best()

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
