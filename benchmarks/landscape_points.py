"""Which points of a seed's parameter space a landscape measures, and in what order.

A landscape recorded on a GPU is only as useful as its coverage, and device time comes
in short sessions; so the order is fixed and every session adds new points:

1. every seed's defaults;
2. every one-parameter-away neighbour of each seed (each declared knob or launch
   parameter moved alone to each other value; where a declared constraint breaks, the
   others are repaired), one seed after another in turn;
3. uniform draws over each seed's valid combinations of knobs and launch parameters
   (evokernel.constraints.sample_valid), again in turn, without end unless a seed's
   space is used up.

No point is listed twice, and none that an earlier landscape holds (``measured_ids``
reads them). The draws of a seed depend only on ``sample_seed`` and the seed's name, so
naming other seeds beside it does not change them. Used by benchmarks/landscape_gpu.py,
benchmarks/topk_family_gpu.py and benchmarks/attn_gpu_check.py.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evokernel import constraints as rules
from evokernel.candidate import Candidate, ParamValue
from evokernel.evaluate.replay import read_landscape_text

DRAW_BATCH = 64
"""Combinations drawn at once from one seed's space (draws are cheap; this bounds waste)."""


class LandscapeFileError(ValueError):
    """An earlier landscape that cannot be read, or was measured on other shapes."""


@dataclass(frozen=True)
class Point:
    """One configuration to measure: which seed it comes from and why it is listed."""

    seed: str
    kind: str
    """Why it is listed: here "default", "neighbour" or "sample" (other lists, other words)."""
    label: str
    candidate: Candidate


def with_values(c: Candidate, values: dict[str, ParamValue], operator: str) -> Candidate:
    """``c`` with these parameter values (knobs and launch parameters alike), generation 0."""
    return c.with_params(knobs={k: v for k, v in values.items() if k in c.knob_space},
                         launch={k: v for k, v in values.items() if k in c.launch_space},
                         operator=operator, generation=0)


def one_at_a_time(seed: Candidate, operator: str = "sweep") -> list[tuple[str, Candidate]]:
    """The seed with each declared parameter moved, alone, to each other value.

    Labels are ``<seed>.<parameter>=<value>``; knobs first, then launch parameters, each
    in declared order. A move that breaks a constraint is repaired (other values change).
    """
    out = []
    for space in (seed.knob_space, seed.launch_space):
        for name, param in space.items():
            current = seed.params[name]
            for value in param.choices:
                if value != current:
                    out.append((f"{seed.name}.{name}={value}", with_values(seed, {name: value}, operator)))
    return out


def draw_rng(sample_seed: int, seed_name: str) -> np.random.Generator:
    """The generator of one seed's draws: fixed by the sample seed and the seed's name."""
    name_key = int.from_bytes(hashlib.sha256(seed_name.encode()).digest()[:8], "little")
    return np.random.default_rng([sample_seed, name_key])


def uniform_draws(seed: Candidate, sample_seed: int, known: set[str]) -> Iterator[tuple[str, Candidate]]:
    """Uniform valid draws over ``seed``'s knobs and launch parameters, each point once.

    Points whose id is in ``known`` are passed over (and the ids this yields are added
    to it). Ends when every valid combination has been met, never otherwise. Labels
    are ``<seed>.sample:<n>``, counting the points yielded.
    """
    declared = rules.check_declared(seed.constraints, seed.space)
    total = rules.count_valid(seed.space, declared)
    rng = draw_rng(sample_seed, seed.name)
    met: set[str] = set()  # this seed's points drawn so far, measured before or not
    yielded = 0
    while len(met) < total:
        for values in rules.sample_valid(seed.space, declared, rng, DRAW_BATCH):
            candidate = with_values(seed, values, "sample")
            met.add(candidate.id)
            if candidate.id not in known:
                known.add(candidate.id)
                yield f"{seed.name}.sample:{yielded:04d}", candidate
                yielded += 1
            if len(met) >= total:
                return


def grid(seed: Candidate, names: Sequence[str], sample_seed: int) -> list[tuple[str, Candidate]]:
    """Every valid combination of the named parameters, the others at the seed's values.

    A landscape that holds the whole grid is a search space no strategy can leave
    (evokernel.analysis.landscape restricts each parameter to the values it recorded),
    so a comparison on it has no unseen proposals. The order is a permutation fixed by
    ``sample_seed`` and the seed's name, so a grid cut short by a time budget is a
    uniform subset of it and the next session, skipping what was measured, continues
    it. Labels are ``<seed>.grid:<n>`` in that order. ValueError for a name the seed
    does not declare.
    """
    unknown = [n for n in names if n not in seed.space]
    if unknown:
        raise ValueError(f"{seed.name} declares no parameter {unknown} (it has {sorted(seed.space)})")
    declared = rules.check_declared(seed.constraints, seed.space)
    combos = [dict(zip(names, values, strict=True))
              for values in itertools.product(*(seed.space[n].choices for n in names))]
    valid = [c for c in combos if not rules.violated(declared, {**seed.params, **c})]
    order = draw_rng(sample_seed, seed.name).permutation(len(valid))
    return [(f"{seed.name}.grid:{i:04d}", with_values(seed, valid[j], "grid"))
            for i, j in enumerate(order)]


def _in_turn(streams: list[Iterator[Point]]) -> Iterator[Point]:
    """One point from each stream in turn; an ended stream drops out."""
    live = list(streams)
    while live:
        for stream in list(live):
            point = next(stream, None)
            if point is None:
                live.remove(stream)
            else:
                yield point


def landscape_points(seeds: Sequence[Candidate], sample_seed: int,
                     measured: Iterable[str] = (), grid_names: Sequence[str] = ()) -> Iterator[Point]:
    """Every point to measure, in order (module docstring), none of ``measured``.

    Lazy: the draws are made as the caller asks for points, so a caller that stops at
    a time budget never pays for the rest. ValueError if two seeds share a name. With
    ``grid_names``, the points are each seed's defaults then its ``grid`` over those
    parameters (seeds in turn), and nothing else.
    """
    names = [s.name for s in seeds]
    if len(set(names)) != len(names):
        raise ValueError(f"seeds named twice: {sorted({n for n in names if names.count(n) > 1})}")
    known = set(measured)

    def fresh(seed: Candidate, kind: str, pairs: Iterable[tuple[str, Candidate]]) -> Iterator[Point]:
        for label, candidate in pairs:
            if candidate.id not in known:
                known.add(candidate.id)
                yield Point(seed.name, kind, label, candidate)

    for seed in seeds:
        yield from fresh(seed, "default", [(f"{seed.name}.default", seed)])
    if grid_names:
        grids = [grid(s, grid_names, sample_seed) for s in seeds]  # names checked before any point
        yield from _in_turn([fresh(s, "grid", g) for s, g in zip(seeds, grids, strict=True)])
        return
    yield from _in_turn([fresh(s, "neighbour", one_at_a_time(s, "neighbour")) for s in seeds])
    def draws(seed: Candidate) -> Iterator[Point]:
        for label, candidate in uniform_draws(seed, sample_seed, known):
            yield Point(seed.name, "sample", label, candidate)

    yield from _in_turn([draws(s) for s in seeds])


@dataclass(frozen=True)
class Record:
    """One record of a landscape file: its candidate's id, its line, where it was read."""

    candidate_id: str
    line: str
    shapes: frozenset[str]
    where: str
    """``path:line``, for messages."""


def read_records(landscapes: Iterable[Path]) -> list[Record]:
    """Every record of these landscapes (JSON lines, plain, xz or gzip), in order.
    LandscapeFileError (one line) for an unreadable file or record."""
    records = []
    for path in landscapes:
        try:
            lines = read_landscape_text(path).splitlines()
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise LandscapeFileError(f"cannot read landscape {path}: {exc}") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                candidate_id = Candidate.model_validate(record["candidate"]).id
                shapes = record.get("shapes") or [s["shape"] for s in record["evaluation"]["shapes"]]
            except (ValueError, KeyError, TypeError) as exc:
                raise LandscapeFileError(f"{path}:{number}: not a landscape record "
                                         f"({str(exc).splitlines()[0]})") from exc
            records.append(Record(candidate_id, line, frozenset(shapes), f"{path}:{number}"))
    return records


def measured_ids(landscapes: Iterable[Path], shapes: Sequence[str] | None = None) -> set[str]:
    """Ids of the candidates in earlier landscapes (JSON lines, plain, xz or gzip).

    With ``shapes``, every record must have been measured on that same set: a point
    measured on other shapes does not combine with these, so it is not a reason to
    skip one. LandscapeFileError (one line) for an unreadable file or record.
    """
    found: set[str] = set()
    for record in read_records(landscapes):
        if shapes is not None and record.shapes != set(shapes):
            raise LandscapeFileError(
                f"{record.where}: measured on other shapes than these "
                f"({len(record.shapes)} shapes, not the {len(shapes)} asked for)")
        found.add(record.candidate_id)
    return found
