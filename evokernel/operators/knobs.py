"""Built-in operators over declared parameters: knob mutation and knob crossover.

They change only parameter values, never code, so they are cheap, deterministic
given the RNG, and always produce valid candidates (values come from the declared
choices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from evokernel.candidate import Candidate, Param, ParamValue
from evokernel.operators.base import OperatorContext

Space = Literal["knobs", "launch"]


def _mutable(candidate: Candidate, spaces: Sequence[Space]) -> list[tuple[Space, str, Param]]:
    out: list[tuple[Space, str, Param]] = []
    for space in spaces:
        declared = candidate.knob_space if space == "knobs" else candidate.launch_space
        out.extend((space, name, p) for name, p in sorted(declared.items()) if len(p.choices) > 1)
    return out


def _new_value(param: Param, current: ParamValue, ctx: OperatorContext, neighbour_p: float) -> ParamValue:
    """Another declared choice; an ordinal neighbour (index +-1) with probability ``neighbour_p``."""
    choices = list(param.choices)
    i = choices.index(current) if current in choices else 0
    if ctx.rng.random() < neighbour_p:
        near = [j for j in (i - 1, i + 1) if 0 <= j < len(choices)]
        return choices[near[int(ctx.rng.integers(len(near)))]]
    others = [c for j, c in enumerate(choices) if j != i]
    return others[int(ctx.rng.integers(len(others)))]


class KnobMutation:
    """Change 1..``max_changes`` parameters to another declared choice."""

    arity = 1

    def __init__(
        self,
        max_changes: int = 2,
        neighbour_p: float = 0.7,
        spaces: Sequence[Space] = ("knobs",),
        name: str = "knob_mutation",
    ) -> None:
        if max_changes < 1:
            raise ValueError("max_changes must be >= 1")
        self.max_changes = max_changes
        self.neighbour_p = neighbour_p
        self.spaces = tuple(spaces)
        self.name = name

    def propose(self, parents: Sequence[Candidate], ctx: OperatorContext) -> list[Candidate]:
        (parent,) = parents
        mutable = _mutable(parent, self.spaces)
        if not mutable:
            return []
        n = int(ctx.rng.integers(1, min(self.max_changes, len(mutable)) + 1))
        picked = ctx.rng.choice(len(mutable), size=n, replace=False)
        knobs: dict[str, ParamValue] = {}
        launch: dict[str, ParamValue] = {}
        values = parent.params
        for j in sorted(int(x) for x in picked):
            space, name, param = mutable[j]
            target = knobs if space == "knobs" else launch
            target[name] = _new_value(param, values[name], ctx, self.neighbour_p)
        return [
            parent.with_params(
                knobs=knobs, launch=launch, operator=self.name, generation=ctx.generation
            )
        ]


class KnobCrossover:
    """Uniform crossover of parameter values between two parents.

    Same code: every knob comes from either parent with probability 1/2. Different
    code: the child keeps one parent's code (chosen at random) and takes, from the
    other, only the values of knobs that exist in both spaces and are legal choices.
    """

    arity = 2

    def __init__(self, spaces: Sequence[Space] = ("knobs",), name: str = "knob_crossover") -> None:
        self.spaces = tuple(spaces)
        self.name = name

    def propose(self, parents: Sequence[Candidate], ctx: OperatorContext) -> list[Candidate]:
        a, b = parents
        if a.code_id != b.code_id and ctx.rng.random() < 0.5:
            a, b = b, a
        donor = b.params
        knobs: dict[str, ParamValue] = {}
        launch: dict[str, ParamValue] = {}
        for space, name, param in _mutable(a, self.spaces):
            if name in donor and donor[name] in param.choices and ctx.rng.random() < 0.5:
                (knobs if space == "knobs" else launch)[name] = donor[name]
        child = a.with_params(knobs=knobs, launch=launch, operator=self.name, generation=ctx.generation)
        child = child.model_copy(update={"parents": (a.id, b.id)})
        return [] if child.id in (a.id, b.id) else [child]
