"""Search strategies behind one ask/tell interface, and a registry by name."""

from __future__ import annotations

from typing import Any

from evokernel.strategies.base import BaseStrategy, Strategy, StrategyEnv
from evokernel.strategies.evolutionary import Evolutionary
from evokernel.strategies.greedy import GreedyHillClimb
from evokernel.strategies.optuna_only import OptunaSearch
from evokernel.strategies.random_search import RandomSearch

STRATEGIES: dict[str, type[BaseStrategy]] = {
    cls.name: cls for cls in (Evolutionary, RandomSearch, GreedyHillClimb, OptunaSearch)
}


def make_strategy(name: str, env: StrategyEnv, options: dict[str, Any] | None = None) -> BaseStrategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[name](env, **(options or {}))  # type: ignore[arg-type]


def strategy_from_state(state: dict[str, Any], env: StrategyEnv) -> BaseStrategy:
    name = state.get("strategy")
    if name not in STRATEGIES:
        raise ValueError(f"snapshot names unknown strategy {name!r}")
    return STRATEGIES[name].from_state(state, env)  # type: ignore[attr-defined,no-any-return]


__all__ = [
    "STRATEGIES",
    "BaseStrategy",
    "Evolutionary",
    "GreedyHillClimb",
    "OptunaSearch",
    "RandomSearch",
    "Strategy",
    "StrategyEnv",
    "make_strategy",
    "strategy_from_state",
]
