"""Islands and MAP-Elites grids as the newest snapshot holds them, for the page.

A snapshot's ``strategy`` entry is the strategy's own ``state()`` (see
``evokernel/strategies/``): the evolutionary strategy keeps ``islands`` (``kind:
islands``, a ``home`` map from candidate id to island, and one population state per
island: a tournament ``pool`` with ``members`` or a ``map_elites`` grid with
``axes`` and ``cells``). Other strategies have no islands; every function here then
returns an empty answer. Anything malformed is skipped, never raised.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from pydantic import ValidationError

from evokernel.evaluate.result import Evaluation

UNKNOWN = "?"


def homes(strategy: Any) -> dict[str, int]:
    """Candidate id -> island index, as the islands coordinator assigned them."""
    islands = _islands(strategy)
    raw = islands.get("home") if islands else None
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, int)}


def island_of(candidate_id: str, parents: tuple[str, ...], home: dict[str, int]) -> int | None:
    """The island of a candidate: its own home, else its first parent's with one (as the coordinator
    routes children), else None (evaluated after the newest snapshot, or no islands)."""
    for cid in (candidate_id, *parents):
        if cid in home:
            return home[cid]
    return None


def islands(strategy: Any) -> list[dict[str, Any]]:
    """Per island: kind, size, capacity and its best members."""
    state = _islands(strategy)
    out = []
    for index, pop in enumerate(state.get("islands", []) if state else []):
        if not isinstance(pop, dict):
            continue
        entries = pop.get("members") if pop.get("kind") != "map_elites" else pop.get("cells")
        members = [m for e in entries or [] if (m := _entry(e)) is not None]
        members.sort(key=lambda m: (m["passed"], m["fitness"] or 0.0), reverse=True)
        out.append({"index": index, "kind": pop.get("kind"), "size": len(members),
                    "capacity": pop.get("capacity"), "best": members[0] if members else None,
                    "top": members[:5]})
    return out


def map_elites(strategy: Any) -> list[dict[str, Any]]:
    """Per MAP-Elites island: its axes with readable bin labels and its occupied cells."""
    state = _islands(strategy)
    out = []
    for index, pop in enumerate(state.get("islands", []) if state else []):
        if not isinstance(pop, dict) or pop.get("kind") != "map_elites":
            continue
        axes = [a for a in pop.get("axes", []) if isinstance(a, dict)]
        cells = []
        for c in pop.get("cells", []):
            entry = _entry(c)
            if entry is not None and isinstance(c.get("cell"), list):
                cells.append({"cell": [str(x) for x in c["cell"]], **entry})
        out.append({"island": index, "axes": [_axis(a, i, cells) for i, a in enumerate(axes)], "cells": cells})
    return out


def _axis(axis: dict[str, Any], position: int, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Bins in grid order with labels: edges become ranges, parameter values stay as they are."""
    seen = {c["cell"][position] for c in cells if len(c["cell"]) > position}
    if axis.get("source") == "resource" and isinstance(axis.get("edges"), list):
        edges = [float(e) for e in axis["edges"]]
        bins = [str(i) for i in range(len(edges) + 1)]
        if edges:
            labels = [f"<{edges[0]:g}", *(f"{lo:g}-{hi:g}" for lo, hi in pairwise(edges)), f">={edges[-1]:g}"]
        else:
            labels = ["all"]
    else:
        bins = sorted(seen - {UNKNOWN}, key=_natural)
        labels = list(bins)
    if UNKNOWN in seen:
        bins, labels = [*bins, UNKNOWN], [*labels, "unknown"]
    return {"name": axis.get("name", f"axis {position}"), "source": axis.get("source"), "bins": bins,
            "labels": labels}


def _natural(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _islands(strategy: Any) -> dict[str, Any] | None:
    if not isinstance(strategy, dict):
        return None
    state = strategy.get("islands")
    return state if isinstance(state, dict) and isinstance(state.get("islands"), list) else None


def _entry(entry: Any) -> dict[str, Any] | None:
    """A population entry (candidate + evaluation dumps) as id, name, status and fitness."""
    if not isinstance(entry, dict) or not isinstance(entry.get("candidate"), dict):
        return None
    try:
        evaluation = Evaluation.model_validate(entry.get("evaluation"))
    except ValidationError:
        return None
    cand = entry["candidate"]
    return {"id": evaluation.candidate_id, "name": cand.get("name"), "operator": cand.get("operator"),
            "status": evaluation.status.value, "fitness": evaluation.fitness,
            "passed": evaluation.fitness is not None}
