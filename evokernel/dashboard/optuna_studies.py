"""The Optuna studies of a run (``<run>/optuna/*.log``), read without touching them.

The search keeps each study in an Optuna JournalStorage file (``tuning.py``: one
``tune-<candidate>.log`` per tuned champion; ``strategy.log`` for the Optuna
strategy). Those files are already what optuna-dashboard opens:
``optuna-dashboard <run>/optuna/<file>.log`` (one storage per file). Here they are
read through Optuna's own ``JournalStorage`` over a read-only backend that holds
the file's bytes as read, so nothing in the run directory is created, locked or
appended to (Optuna's file backend would create a missing file and take a lock to
write). A study file being rewritten or torn is reported, not raised.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import TrialState

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)


class ReadOnlyJournal(BaseJournalBackend):
    """The complete lines of an Optuna journal file, as read once; appending is refused."""

    def __init__(self, data: bytes) -> None:
        complete, _, _ = data.rpartition(b"\n")  # a last line without its newline is in flight
        self._logs = [json.loads(line) for line in complete.split(b"\n") if line.strip()]

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        yield from self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise PermissionError("the dashboard never writes into a run directory")


def summarize(path: Path) -> list[dict[str, Any]]:
    """One summary per study in the journal file ``path``; raises ``ValueError`` if unreadable."""
    try:
        storage = JournalStorage(ReadOnlyJournal(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"optuna/{path.name} is unreadable ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    out = []
    for study in storage.get_all_studies():
        trials = storage.get_all_trials(storage.get_study_id_from_name(study.study_name), deepcopy=False)
        complete = [t for t in trials if t.state is TrialState.COMPLETE and t.value is not None]
        best = max(complete, key=lambda t: t.value or -math.inf, default=None)
        out.append({
            "file": str(path), "name": study.study_name, "trials": len(trials), "complete": len(complete),
            "failed": sum(t.state is TrialState.FAIL for t in trials),
            "best_value": None if best is None else best.value,
            "best_params": None if best is None else best.params,
            "values": [t.value if t.state is TrialState.COMPLETE else None for t in trials],
            "command": f"optuna-dashboard {path}",
        })
    return out


@dataclass
class StudyFiles:
    """Every ``*.log`` study file of a run's ``optuna/`` folder, re-read when one changes."""

    directory: Path
    _cache: dict[str, tuple[tuple[int, int], list[dict[str, Any]], str | None]] = field(default_factory=dict)

    def poll(self) -> bool:
        """Re-read the study files that changed (by size and mtime); True if any did."""
        try:
            files = sorted(p for p in self.directory.iterdir() if p.suffix == ".log" and not p.name.startswith("."))
        except OSError:
            files = []
        fresh: dict[str, tuple[tuple[int, int], list[dict[str, Any]], str | None]] = {}
        for path in files:
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            held = self._cache.get(path.name)
            if held is not None and held[0] == key:
                fresh[path.name] = held
                continue
            try:
                fresh[path.name] = (key, summarize(path), None)
            except ValueError as exc:
                fresh[path.name] = (key, [], str(exc))
        changed = fresh != self._cache
        self._cache = fresh
        return changed

    @property
    def problems(self) -> list[str]:
        return [why for _, (_, _, why) in sorted(self._cache.items()) if why]

    def summaries(self) -> list[dict[str, Any]]:
        return [s for _, (_, studies, _) in sorted(self._cache.items()) for s in studies]
