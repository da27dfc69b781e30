"""Search strategies behind one ask/tell interface, found by name in ``STRATEGIES``.

A new strategy is one file with a :class:`Strategy` subclass plus one line::

    STRATEGIES.register("annealing", Annealing)

after which ``--strategy annealing`` works in search and compare. A config may
also name a class by import path (``strategy: mypkg.mine:Annealing``).
"""

from __future__ import annotations

from typing import Any

from evokernel.registry import Registry
from evokernel.strategies.base import RunServices, Strategy, StrategyEnv
from evokernel.strategies.evolutionary import Evolutionary, MapElitesIslands
from evokernel.strategies.greedy import GreedyHillClimb
from evokernel.strategies.optuna_only import OptunaSearch
from evokernel.strategies.random_search import RandomSearch

STRATEGIES: Registry[type[Strategy]] = Registry("strategy")
for _cls in (Evolutionary, MapElitesIslands, RandomSearch, GreedyHillClimb, OptunaSearch):
    STRATEGIES.register(_cls.name, _cls)


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name`` (or at the import path ``name``); ``ValueError``
    with the known names if there is none."""
    cls = STRATEGIES.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ValueError(f"strategy {name!r} is not a Strategy subclass")
    return cls


def make_strategy(name: str, env: StrategyEnv, options: dict[str, Any] | None = None) -> Strategy:
    return strategy_class(name)(env, **(options or {}))


def strategy_from_state(state: dict[str, Any], env: StrategyEnv, name: str | None = None) -> Strategy:
    """Rebuild from a snapshot; ``name`` (the run config's) wins over the name the state
    records, so a strategy known only by import path resumes too."""
    return strategy_class(name or str(state.get("strategy"))).from_state(state, env)


__all__ = [
    "STRATEGIES",
    "Evolutionary",
    "GreedyHillClimb",
    "MapElitesIslands",
    "OptunaSearch",
    "RandomSearch",
    "RunServices",
    "Strategy",
    "StrategyEnv",
    "make_strategy",
    "strategy_class",
    "strategy_from_state",
]
