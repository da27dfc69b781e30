"""Which operator makes each child: the built-in knob operators and the LLM operators, by rates.

A strategy whose ``operators.kind`` is ``llm`` or ``mixed``, or whose ``operators.rates`` name
any operator, keeps one :class:`Mixer`. Each
child slot draws one operator from the strategy's seeded RNG, in proportion to its rate
(``rates`` by name: ``knob_mutation``, ``knob_crossover``, ``llm_<name>`` for each LLM
operator), among those that can run now:

* an LLM operator whose token budget is spent (``op.available`` False) is not drawn;
* a repair operator is drawn only while a recent failure waits; its parent is the most
  recent failure (each failure is repaired once; a failed repair is not queued again);
* when nothing configured can run, the built-ins take over at their default rates.

A slot asks the LLM at most once: a proposal that yields no child is filled with a knob
mutation of the same parent (``fill_with_builtin``), and a child already seen is retried
with built-ins only, so bad or repeated replies cost requests, not evaluations. Any other
operator registered in ``OPERATORS`` joins the draw when ``rates`` names it. The LLM
operators are not part of the strategy's state, since a ``ChatClient`` holds sockets and
threads: the run builder makes them from the run config and passes them in
``StrategyEnv.services`` (a :class:`RunServices`), on a new run and on resume alike. The
state holds what decides future choices: the failure queue and the model bandit's counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.operators import OPERATORS, Operator, OperatorContext
from evokernel.populations.base import Entry, dump_entry, load_entry
from evokernel.strategies.base import StrategyEnv

BUILTIN = ("knob_mutation", "knob_crossover")
LLM_PREFIX = "llm_"


@dataclass(frozen=True)
class Arm:
    key: str
    op: Any
    rate: float
    llm: bool = False
    repair: bool = False
    agent: bool = False


class Mixer:
    """The operator choice of one strategy; see the module docstring."""

    def __init__(
        self,
        env: StrategyEnv,
        builtins: Mapping[str, Operator],
        builtin_defaults: Mapping[str, float],
        *,
        kind: str = "mixed",
        rates: Mapping[str, float] | None = None,
        fill_with_builtin: bool = True,
        failure_memory: int = 8,
    ) -> None:
        if kind not in ("builtin", "llm", "mixed"):
            raise ValueError(f"operators.kind {kind!r}: choose builtin, llm or mixed")
        self.env = env
        self.options: dict[str, Any] = {
            "kind": kind, "rates": dict(rates or {}), "fill_with_builtin": fill_with_builtin,
            "failure_memory": failure_memory,
        }
        self.fill = fill_with_builtin
        self.failure_memory = failure_memory
        self.fill_op = builtins["knob_mutation"]
        given = dict(rates or {})
        total = sum(builtin_defaults.values()) or 1.0
        defaults = {name: builtin_defaults.get(name, 0.0) / total for name in builtins}
        self.fallback = [Arm(name, op, defaults[name]) for name, op in builtins.items()]
        self.arms: list[Arm] = [
            Arm(name, op, float(given.get(name, 0.0 if kind == "llm" else defaults[name])))
            for name, op in builtins.items()
        ]
        for name in sorted(set(given) - set(builtins)):  # other registered operators, by rate
            if not name.startswith(LLM_PREFIX) and name in OPERATORS:
                self.arms.append(Arm(name, OPERATORS.get(name)(), float(given[name])))
        self.llm_ops: list[Any] = list(env.services.llm_operators)
        self.repairable: frozenset[Any] = frozenset()
        if self.llm_ops:
            from evokernel.operators.llm import REPAIRABLE, LLMAgent, LLMRepair

            self.repairable = frozenset(REPAIRABLE)
            weight = sum(op.weight for op in self.llm_ops) or 1.0
            for op in self.llm_ops:
                key = LLM_PREFIX + op.name
                self.arms.append(Arm(key, op, float(given.get(key, op.weight / weight)), llm=True,
                                     repair=isinstance(op, LLMRepair), agent=isinstance(op, LLMAgent)))
        self.repair_names = {a.op.name for a in self.arms if a.repair}
        self.failures: list[Entry] = []
        self.bandit = next((op.bandit for op in self.llm_ops if op.bandit is not None), None)

    # -- what the strategy tells ------------------------------------------------------
    def note(self, candidate: Candidate, evaluation: Evaluation) -> None:
        """Queue a repairable failure (not a failed repair: each lineage is repaired once)."""
        if not any(a.repair and a.rate > 0 for a in self.arms):
            return
        if evaluation.status not in self.repairable or candidate.operator in self.repair_names:
            return
        if any(c.id == candidate.id for c, _ in self.failures):
            return
        self.failures.append((candidate, evaluation))
        del self.failures[: -self.failure_memory]

    # -- choosing -----------------------------------------------------------------------
    def _eligible(self, arms: Sequence[Arm], max_arity: int, llm: bool) -> list[Arm]:
        return [
            a for a in arms
            if a.rate > 0 and a.op.arity <= max_arity
            and (not a.llm or (llm and a.op.available))
            and (not a.repair or bool(self.failures))
        ]

    def draw(self, rng: np.random.Generator, *, max_arity: int = 2, llm: bool = True) -> Arm | None:
        """One operator, in proportion to the rates of those that can run now."""
        pool = self._eligible(self.arms, max_arity, llm)
        if not pool and llm:  # nothing configured applies (LLM budget spent, no failure waiting)
            pool = self._eligible(self.fallback, max_arity, llm=False)
        if not pool:
            return None
        cumulative = np.cumsum([a.rate for a in pool])
        u = float(rng.random()) * float(cumulative[-1])
        return pool[min(int(np.searchsorted(cumulative, u, side="right")), len(pool) - 1)]

    def propose(
        self,
        rng: np.random.Generator,
        pick: Callable[[int], list[Candidate]],
        *,
        generation: int,
        budget_left: float,
        fresh: Callable[[Candidate], bool],
        attempts: int,
        max_arity: int = 2,
    ) -> Candidate | None:
        """One child: draw an operator, its parents (``pick(arity)``, or a waiting failure
        for repair), propose; retry on a child already seen, up to ``attempts`` draws."""
        child: Candidate | None = None
        llm_tried = False
        for _ in range(attempts):
            arm = self.draw(rng, max_arity=max_arity, llm=not llm_tried)
            if arm is None and llm_tried and self.fill:
                arm = Arm("knob_mutation", self.fill_op, 1.0)
            if arm is None:
                break
            evaluations: list[Evaluation | None]
            if arm.repair:
                parent, failed = self.failures.pop()
                parents, evaluations = [parent], [failed]
            else:
                parents = pick(arm.op.arity)
                evaluations = [self._evaluation(p.id) for p in parents]
            ctx = self._context(arm, rng, budget_left, evaluations, generation)
            if arm.agent:
                arm.op.last_evaluations = {}
            proposals = arm.op.propose(parents, ctx)
            llm_tried = llm_tried or arm.llm
            if not proposals and arm.key != "knob_mutation" and (self.fill or not arm.llm):
                proposals = self.fill_op.propose(parents[:1], ctx)
            if not proposals:
                continue
            child = proposals[0]
            if fresh(child):
                return child
        return child

    def _evaluation(self, candidate_id: str) -> Evaluation | None:
        lookup = self.env.services.evaluation_of
        return None if lookup is None else lookup(candidate_id)

    def _context(self, arm: Arm, rng: np.random.Generator, budget_left: float,
                 evaluations: Sequence[Evaluation | None], generation: int) -> OperatorContext:
        ctx = OperatorContext(rng=rng, workload=self.env.workload, budget_left=budget_left,
                              evaluations=evaluations, generation=generation)
        if not arm.llm:
            return ctx
        services = self.env.services
        ctx.workload_brief, ctx.floor_ms = services.workload_brief, services.floor_ms
        ctx.evaluate, ctx.agent_shapes = services.evaluate, services.agent_shapes
        sink = services.on_llm_outcome
        if sink is not None:
            op = arm.op

            def journal(record: Any) -> None:
                sink(record, generation, dict(op.last_evaluations) if arm.agent else {})

            ctx.on_outcome = journal
        return ctx

    # -- state --------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "failures": [dump_entry(c, e) for c, e in self.failures],
            "bandit": None if self.bandit is None else self.bandit.state(),
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self.failures = [load_entry(e) for e in state.get("failures", [])]
        if self.bandit is not None and state.get("bandit"):
            self.bandit.load(state["bandit"])


def make_mixer(
    env: StrategyEnv, options: Mapping[str, Any] | None, builtins: Mapping[str, Operator],
    builtin_defaults: Mapping[str, float],
) -> Mixer | None:
    """A mixer for ``operators`` options (kind llm or mixed, or rates given); None for the
    built-ins alone at their default rates."""
    if not options or (options.get("kind", "builtin") == "builtin" and not options.get("rates")):
        return None
    return Mixer(env, builtins, builtin_defaults, **dict(options))


def known_rates(llm_names: Sequence[str]) -> list[str]:
    """Every name ``operators.rates`` accepts, given the LLM operators' names."""
    registered = [n for n in OPERATORS.names() if n not in BUILTIN]
    return [*BUILTIN, *registered, *(LLM_PREFIX + n for n in llm_names)]
