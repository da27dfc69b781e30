"""Random search: the IID baseline every other strategy has to beat at equal budget."""

from __future__ import annotations

from typing import Any, ClassVar

from evokernel.candidate import Candidate, ParamValue
from evokernel.evaluate.result import Evaluation
from evokernel.strategies.base import BaseStrategy, StrategyEnv


class RandomSearch(BaseStrategy):
    """Uniform over the seeds' code, then uniform over each knob and launch parameter."""

    name: ClassVar[str] = "random"

    def ask(self, n: int) -> list[Candidate]:
        self.generation += 1
        out = []
        for _ in range(n):
            seed = self.seeds[int(self.rng.integers(len(self.seeds)))]
            knobs: dict[str, ParamValue] = {
                k: p.choices[int(self.rng.integers(len(p.choices)))] for k, p in sorted(seed.knob_space.items())
            }
            launch: dict[str, ParamValue] = {
                k: p.choices[int(self.rng.integers(len(p.choices)))] for k, p in sorted(seed.launch_space.items())
            }
            out.append(seed.with_params(knobs=knobs, launch=launch, operator="random", generation=self.generation))
        return out

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        self._tell_common(candidate, evaluation)

    def state(self) -> dict[str, Any]:
        return self._base_state()

    @classmethod
    def from_state(cls, state: dict[str, Any], env: StrategyEnv) -> RandomSearch:
        obj = cls(env)
        obj._load_base(state)
        return obj
