"""MAP-Elites over kernel properties: one elite per cell of a grid of descriptors.

Axes are facts about the kernel, never code length (OpenEvolve's MLX study found
length/edit-distance axes meaningless for kernels): either a build resource from
``Evaluation.resources`` (registers, shared_bytes), binned by edges, or a declared
parameter value (a tile width, an algorithm choice), one cell per value.
"""

from __future__ import annotations

import bisect
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.populations.base import (
    Entry,
    State,
    better,
    dump_entry,
    load_entry,
    register,
)

UNKNOWN = "?"


class Axis(BaseModel):
    """One grid dimension. ``source='resource'`` needs ``edges``; ``'param'`` uses values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    source: Literal["resource", "param"]
    edges: tuple[float, ...] = ()

    @model_validator(mode="after")
    def _edges_sorted(self) -> Axis:
        if self.source == "resource" and not self.edges:
            raise ValueError(f"resource axis {self.name!r} needs bin edges")
        if list(self.edges) != sorted(self.edges):
            raise ValueError(f"axis {self.name!r}: edges must be increasing")
        return self

    def bin(self, candidate: Candidate, evaluation: Evaluation) -> str:
        if self.source == "param":
            value = candidate.params.get(self.name)
            return UNKNOWN if value is None else str(value)
        raw = evaluation.resources.get(self.name)
        return UNKNOWN if raw is None else str(bisect.bisect_right(self.edges, raw))


DEFAULT_AXES = (
    Axis(name="registers", source="resource", edges=(32, 64, 96, 128, 168, 255)),
    Axis(name="shared_bytes", source="resource", edges=(16384, 49152, 98304, 163840)),
)
"""Registers and shared memory per thread block, binned: what a run's ``population.axes``
defaults to."""


class MapElites:
    """Keeps the best candidate of every occupied cell; selects cells uniformly."""

    kind = "map_elites"

    def __init__(self, axes: list[Axis]) -> None:
        if not axes:
            raise ValueError("MAP-Elites needs at least one axis")
        self.axes = list(axes)
        self._cells: dict[tuple[str, ...], Entry] = {}

    def cell(self, candidate: Candidate, evaluation: Evaluation) -> tuple[str, ...]:
        return tuple(axis.bin(candidate, evaluation) for axis in self.axes)

    def add(self, candidate: Candidate, evaluation: Evaluation) -> bool:
        key = self.cell(candidate, evaluation)
        held = self._cells.get(key)
        if held is not None and (held[0].id == candidate.id or not better(evaluation, held[1])):
            return False
        self._cells[key] = (candidate, evaluation)
        return True

    def select(self, k: int, rng: np.random.Generator) -> list[Candidate]:
        keys = sorted(self._cells)
        if not keys or k <= 0:
            return []
        return [self._cells[keys[int(i)]][0] for i in rng.integers(len(keys), size=k)]

    def best(self) -> Entry | None:
        top = self.top(1)
        return top[0] if top else None

    def top(self, k: int) -> list[Entry]:
        ranked = sorted(self._cells.items(), key=lambda kv: (kv[1][1].rank_key(), kv[0]), reverse=True)
        return [entry for _, entry in ranked[:k]]

    def grid(self) -> dict[tuple[str, ...], Entry]:
        return dict(self._cells)

    def __len__(self) -> int:
        return len(self._cells)

    def state(self) -> State:
        cells: list[dict[str, Any]] = [
            {"cell": list(key), **dump_entry(*entry)} for key, entry in sorted(self._cells.items())
        ]
        return {"kind": self.kind, "axes": [a.model_dump(mode="json") for a in self.axes], "cells": cells}

    @classmethod
    def from_state(cls, state: State) -> MapElites:
        grid = cls([Axis.model_validate(a) for a in state["axes"]])
        grid._cells = {tuple(c["cell"]): load_entry(c) for c in state["cells"]}
        return grid


register(MapElites.kind, MapElites.from_state)
