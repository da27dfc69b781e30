"""Random search: the IID baseline every other strategy has to beat at equal budget."""

from __future__ import annotations

from typing import ClassVar

from evokernel.candidate import Candidate, ParamValue
from evokernel.strategies.base import Strategy


class RandomSearch(Strategy):
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
