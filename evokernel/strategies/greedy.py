"""Greedy hill climbing: mutate the incumbent, move only on strict improvement.

With ``operators`` of kind ``llm`` or ``mixed``, each child comes from an operator drawn by
rate among the one-parent operators (knob mutation, LLM mutation, the agent) applied to
the incumbent, or from an LLM repair of a recent failure (``strategies/mixing.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.operators import KnobMutation, OperatorContext
from evokernel.populations.base import better, dump_entry, load_entry
from evokernel.strategies.base import Strategy, StrategyEnv, operator_options
from evokernel.strategies.mixing import make_mixer

if TYPE_CHECKING:
    from evokernel.config import RunConfig


class GreedyHillClimb(Strategy):
    """Each ask proposes ``n`` mutations of the best candidate so far."""

    name: ClassVar[str] = "greedy"
    uses_operators: ClassVar[bool] = True

    @classmethod
    def options_from(cls, config: RunConfig) -> dict[str, Any]:
        return {**config.greedy.model_dump(), **operator_options(config)}

    def __init__(self, env: StrategyEnv, max_changes: int = 1, neighbour_p: float = 0.8, attempts: int = 8,
                 operators: dict[str, Any] | None = None) -> None:
        super().__init__(env)
        self.mutation = KnobMutation(max_changes, neighbour_p, spaces=("knobs", "launch"), name="greedy_mutation")
        self.attempts = attempts
        self.incumbent: tuple[Candidate, Evaluation] | None = None
        self.operators = None if operators is None else dict(operators)
        self.mixer = make_mixer(env, operators, {"knob_mutation": self.mutation}, {"knob_mutation": 1.0})

    def ask(self, n: int) -> list[Candidate]:
        self.generation += 1
        parent = self.incumbent[0] if self.incumbent else self.seeds[0]
        ctx = OperatorContext(
            rng=self.rng, workload=self.env.workload, budget_left=self.budget_left,
            evaluations=[self.incumbent[1] if self.incumbent else None], generation=self.generation,
        )
        out: list[Candidate] = []
        batch: set[str] = set()
        if self.mixer is not None:
            for _ in range(n):
                child = self.mixer.propose(
                    self.rng, lambda k: [parent], generation=self.generation, budget_left=self.budget_left,
                    attempts=self.attempts, max_arity=1,
                    fresh=lambda c: c.id not in self.seen and c.id not in batch,
                )
                if child is not None:
                    out.append(child)
                    batch.add(child.id)
            return out
        for _ in range(n):
            child = None
            for _ in range(self.attempts):  # prefer unseen neighbours; give up after a few
                proposals = self.mutation.propose([parent], ctx)
                if not proposals:
                    break
                child = proposals[0]
                if child.id not in self.seen and child.id not in batch:
                    break
            if child is not None:
                out.append(child)
                batch.add(child.id)
        return out

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        self._tell_common(candidate, evaluation)
        if self.mixer is not None:
            self.mixer.note(candidate, evaluation)
        if self.incumbent is None or better(evaluation, self.incumbent[1]):
            self.incumbent = (candidate, evaluation)

    def state(self) -> dict[str, Any]:
        options: dict[str, Any] = {"max_changes": self.mutation.max_changes,
                                   "neighbour_p": self.mutation.neighbour_p, "attempts": self.attempts}
        out = {
            **self._base_state(),
            "options": options,
            "incumbent": None if self.incumbent is None else dump_entry(*self.incumbent),
        }
        if self.mixer is not None:
            options["operators"] = self.operators
            out["mixer"] = self.mixer.state()
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        self._load_base(state)
        self.incumbent = None if state["incumbent"] is None else load_entry(state["incumbent"])
        if self.mixer is not None:
            self.mixer.load(state.get("mixer", {}))
