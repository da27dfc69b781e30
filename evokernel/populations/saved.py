"""Saved populations: a run's elites in ``populations/<name>/``, to seed later runs.

``search --save-population NAME`` writes the best candidates of a run that passed (or
were built but could not run on that machine: ``SKIPPED``) with everything needed to
judge where they came from::

    populations/<name>/population.json   format, workload, source run, shapes, and per
                                         member the candidate (sources, parameters), its
                                         evaluation and the environment it was measured in
    populations/<name>/README.md         the members as a table (generated)

``search --from-population populations/<name>`` (config key ``seeds_from``) makes the
members the seeds of a new run. Their recorded evaluations are never trusted: the run
evaluates them again like any seed, on its own shapes, input seed and device.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status
from evokernel.files import atomic_write, atomic_write_json, now

FORMAT = 1
ROOT = Path("populations")
"""Where population names resolve, relative to the working directory (the repository)."""
KEEP = (Status.PASSED, Status.SKIPPED)
"""Statuses a member may have: it passed, or it built and waits for a device that can run it."""


class PopulationError(ValueError):
    """A population that cannot be saved or loaded; the message is one line."""


@dataclass(frozen=True)
class Member:
    candidate: Candidate
    evaluation: Evaluation
    """As recorded where the population was saved (for information only)."""


@dataclass(frozen=True)
class SavedPopulation:
    path: Path
    name: str
    workload: str
    members: tuple[Member, ...]
    source: dict[str, Any]
    sha256: str

    def seeds(self) -> list[Candidate]:
        """The members as seeds of a new run: same content (same ids), lineage reset."""
        return [m.candidate.model_copy(update={"operator": "seed", "parents": (), "generation": 0})
                for m in self.members]

    def describe(self) -> dict[str, Any]:
        """What a run's manifest records of the population it was seeded from."""
        return {"path": str(self.path), "name": self.name, "sha256": self.sha256,
                "members": [m.candidate.id for m in self.members]}


def resolve(name_or_path: str | Path) -> Path:
    """A population folder: a path as given, or a plain name under ``populations/``."""
    path = Path(name_or_path)
    if path.exists() or len(path.parts) > 1:
        return path
    return ROOT / path


def check_new(name_or_path: str | Path) -> Path:
    """Where a population will be saved; ``PopulationError`` if that is taken."""
    path = resolve(name_or_path)
    if not path.name or path.name.startswith("."):
        raise PopulationError(f"population name {str(name_or_path)!r}: give a plain folder name")
    if path.exists():
        raise PopulationError(f"population {path} already exists; pick another name or remove it")
    return path


def elites(entries: Sequence[tuple[Candidate, Evaluation]], k: int) -> list[Member]:
    """The ``k`` best entries that passed or were skipped, best first (first seen wins ties)."""
    kept = [(c, e) for c, e in entries if e.status in KEEP]
    order = sorted(range(len(kept)), key=lambda i: (tuple(-x for x in kept[i][1].rank_key()), i))
    seen: set[str] = set()
    out = []
    for i in order:
        cand, ev = kept[i]
        if cand.id not in seen:
            seen.add(cand.id)
            out.append(Member(cand, ev))
    return out[:k]


def save(path: Path, members: Sequence[Member], *, workload: str, source: dict[str, Any]) -> Path:
    """Write a population folder (it must not exist); returns ``population.json``."""
    if not members:
        raise PopulationError("no candidate passed (or built and was skipped): nothing to save")
    if path.exists():
        raise PopulationError(f"population {path} already exists; pick another name or remove it")
    path.mkdir(parents=True)
    data = {
        "format": FORMAT, "kind": "evokernel-population", "name": path.name, "workload": workload,
        "created": now(), "source": source,
        "members": [{"candidate": m.candidate.model_dump(mode="json"),
                     "evaluation": m.evaluation.model_dump(mode="json"),
                     "environment": dict(m.evaluation.environment)} for m in members],
    }
    atomic_write_json(path / "population.json", data)
    atomic_write(path / "README.md", _readme(path.name, workload, source, members))
    return path / "population.json"


def load(name_or_path: str | Path) -> SavedPopulation:
    path = resolve(name_or_path)
    file = path / "population.json"
    try:
        raw = file.read_bytes()
        data = json.loads(raw)
    except FileNotFoundError:
        raise PopulationError(f"{path} is not a saved population (no population.json)") from None
    except (OSError, ValueError) as exc:
        raise PopulationError(f"{file} is unreadable or corrupt: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or data.get("kind") != "evokernel-population":
        raise PopulationError(f"{file} is not an evokernel population")
    if not isinstance(data.get("format"), int) or data["format"] > FORMAT:
        raise PopulationError(f"{file} has format {data.get('format')!r}; this evokernel reads up to {FORMAT}")
    try:
        members = tuple(Member(Candidate.model_validate(m["candidate"]), Evaluation.model_validate(m["evaluation"]))
                        for m in data["members"])
        workload = str(data["workload"])
    except (KeyError, TypeError, ValidationError) as exc:
        raise PopulationError(f"{file} is corrupt: {str(exc).splitlines()[0]}") from None
    if not members:
        raise PopulationError(f"{file} has no members")
    odd = [m.candidate.name for m in members if m.candidate.workload != workload]
    if odd:
        raise PopulationError(f"{file}: member {odd[0]} is not of workload {workload}")
    return SavedPopulation(path, str(data.get("name", path.name)), workload, members,
                           dict(data.get("source") or {}), hashlib.sha256(raw).hexdigest())


def _readme(name: str, workload: str, source: dict[str, Any], members: Sequence[Member]) -> str:
    shapes = source.get("shapes") or []
    lines = [f"# Population {name}", "",
             f"Workload {workload}; saved from run `{source.get('run', '?')}` ({source.get('strategy', '?')}, "
             f"seed {source.get('seed', '?')}, {source.get('evaluations', '?')} evaluations on {len(shapes)} "
             f"shapes) by `{source.get('command', 'search --save-population')}`. Seed a run with "
             f"`python -m evokernel.search --from-population populations/{name}` (every member is "
             "evaluated again there: the figures below are where it came from, not a promise).", "",
             "| # | candidate | name | language | status | fitness (geomean speedup) | mean speedup | device |",
             "|---|---|---|---|---|---|---|---|"]
    for i, m in enumerate(members, start=1):
        ev = m.evaluation
        fit = "-" if ev.fitness is None else f"{ev.fitness:.3f}"
        mean = "-" if ev.mean_speedup is None else f"{ev.mean_speedup:.3f}"
        device = ev.environment.get("device") or ev.environment.get("gpu") or "?"
        lines.append(f"| {i} | {m.candidate.id} | {m.candidate.name} | {m.candidate.language.value} | "
                     f"{ev.status.value} | {fit} | {mean} | {device} |")
    return "\n".join(lines) + "\n"
