"""A recorded landscape as a search space: its seeds, its shapes, its best point.

A landscape is a JSON-lines file of ``{"candidate", "evaluation", "shapes"}`` records
(what ``ReplayEvaluator`` serves). To search it, strategies must propose only
candidates that were measured, so the search space is taken from the file: each
workload seed whose code matches the recorded candidates keeps its declared
parameters, restricted to the values that occur in the landscape. ``Candidate.id``
hashes parameter values, not spaces, so restricted candidates keep the recorded ids.
If the landscape is a full grid over those values, no proposal is ever unseen.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evokernel import constraints as rules
from evokernel.candidate import Candidate, Param, ParamValue
from evokernel.evaluate.replay import (
    LANDSCAPE_SUFFIXES,
    LandscapeError,
    ReplayEvaluator,
)
from evokernel.evaluate.result import Evaluation

__all__ = ["Landscape", "LandscapeError", "default_landscape", "record_grid", "replay_evaluator"]


def replay_evaluator(workload: str, *, landscape: str) -> ReplayEvaluator:
    """``evaluator.factory`` entry point: ``Class(workload, **options)`` over a file."""
    return ReplayEvaluator.from_file(landscape)


def default_landscape(workload_dir: Path) -> Path | None:
    """The one landscape (``*.jsonl``, ``*.jsonl.xz``, ``*.jsonl.gz``) of a workload's
    ``landscapes/`` folder, None if there is none."""
    folder = workload_dir / "landscapes"
    found = sorted(p for suffix in LANDSCAPE_SUFFIXES for p in folder.glob(f"*{suffix}"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise LandscapeError(f"{workload_dir / 'landscapes'} holds several landscapes ({names}); pick one with --landscape")
    return found[0] if found else None


@dataclass(frozen=True)
class Landscape:
    path: Path
    replay: ReplayEvaluator
    shapes: tuple[str, ...]
    sha256: str

    @classmethod
    def load(cls, path: str | Path) -> Landscape:
        path = Path(path)
        replay = ReplayEvaluator.from_file(path)  # reads (and decompresses) the file once
        if len(replay.shape_sets) != 1:
            raise LandscapeError(f"landscape {path}: records were measured on "
                                 f"{len(replay.shape_sets)} different shape sets")
        (shapes,) = replay.shape_sets.values()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return cls(path, replay, shapes, digest)

    def __len__(self) -> int:
        return len(self.replay)

    def best(self) -> tuple[Candidate, Evaluation] | None:
        return self.replay.best()

    @property
    def best_fitness(self) -> float | None:
        best = self.best()
        return None if best is None else best[1].fitness

    def seeds(self, workload_seeds: Sequence[Candidate]) -> list[Candidate]:
        """One seed per recorded code: the workload's seed, restricted to the recorded values.

        A code with no matching workload seed falls back to its first recorded
        candidate, reset to a seed (no parents) at the restricted defaults.
        """
        groups: dict[str, list[Candidate]] = {}
        for cand in self.replay.candidates():
            groups.setdefault(cand.code_id, []).append(cand)
        by_code: dict[str, Candidate] = {}
        for seed in workload_seeds:
            by_code.setdefault(seed.code_id, seed)
        out = []
        for code_id, recorded in groups.items():
            base = by_code.get(code_id)
            if base is None:
                base = recorded[0].model_copy(update={"parents": (), "operator": "seed", "generation": 0,
                                                      "knobs": {}, "launch": {}})
            out.append(_restricted(base, recorded, self.path))
        return out

    def describe(self, seeds: Sequence[Candidate]) -> dict[str, Any]:
        """Facts a comparison records about its landscape (size, coverage, best)."""
        best = self.best()
        grid = sum(valid_points(s) for s in seeds)
        ids = {c.id for c in self.replay.candidates()}
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "records": len(self),
            "shapes": list(self.shapes),
            "grid_points": grid,
            "best_fitness": None if best is None else best[1].fitness,
            "best_candidate": None if best is None else best[0].id,
            "passed": sum(1 for c in self.replay.candidates() if self.replay.evaluate(c, self.shapes).fitness is not None),
            "seeds": [{"id": s.id, "name": s.name, "in_landscape": s.id in ids} for s in seeds],
            "environment": self.replay.environment(),
        }


def valid_points(seed: Candidate) -> int:
    """How many combinations of the seed's declared values satisfy its constraints (the
    plain product where a group of linked parameters is too large to enumerate)."""
    try:
        return rules.count_valid(seed.space, rules.check_declared(seed.constraints, seed.space))
    except ValueError:
        return math.prod(len(p.choices) for p in seed.space.values())


def _restricted(base: Candidate, recorded: Sequence[Candidate], path: Path) -> Candidate:
    names = set(base.knob_space) | set(base.launch_space)
    for cand in recorded:
        if set(cand.params) != names:
            raise LandscapeError(
                f"landscape {path}: candidate {cand.id} has parameters {sorted(cand.params)}, "
                f"but seed {base.name} declares {sorted(names)}"
            )

    def restrict(space: dict[str, Param]) -> dict[str, Param]:
        out = {}
        for name, param in space.items():
            seen: list[ParamValue] = list(dict.fromkeys(c.params[name] for c in recorded))
            ordered = [v for v in param.choices if v in seen] + [v for v in seen if v not in param.choices]
            default = param.initial if param.initial in ordered else ordered[0]
            out[name] = Param(choices=tuple(ordered), default=default)
        return out

    knob_space, launch_space = restrict(base.knob_space), restrict(base.launch_space)
    knobs = {k: v for k, v in base.knobs.items() if v in knob_space[k].choices}
    launch = {k: v for k, v in base.launch.items() if v in launch_space[k].choices}
    return base.model_copy(update={"knob_space": knob_space, "launch_space": launch_space,
                                   "knobs": knobs, "launch": launch}).revalidated()


def grid(seed: Candidate, *, fix_launch: bool = True) -> list[Candidate]:
    """Every knob combination of ``seed`` (launch parameters at their initial values)."""
    names = sorted(seed.knob_space)
    base = seed
    if fix_launch:
        fixed = {n: Param(choices=(p.initial,)) for n, p in seed.launch_space.items()}
        base = seed.model_copy(update={"launch_space": fixed, "launch": {}}).revalidated()
    out = [base.with_params(knobs=dict(zip(names, values, strict=True)), operator="landscape", generation=0)
           for values in itertools.product(*(seed.knob_space[n].choices for n in names))]
    return list({c.id: c for c in out}.values())


def record_grid(candidates: Iterable[Candidate], evaluator: Any, shapes: Sequence[str], path: Path) -> int:
    """Evaluate ``candidates`` and write them as a landscape file (for tests and CPU grids)."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for cand in candidates:
            evaluation = evaluator.evaluate(cand, list(shapes))
            f.write(json.dumps({"candidate": cand.model_dump(mode="json"),
                                "evaluation": evaluation.model_dump(mode="json", exclude={"log"}),
                                "shapes": list(shapes)}) + "\n")
            n += 1
    return n
