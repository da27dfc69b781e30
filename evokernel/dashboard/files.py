"""Tolerant, read-only readers of the files a run directory holds, while it is written.

The dashboard reads a run directory that a live search is writing, so every reader
here expects a file to be missing, half-written or replaced between two looks, and
says so in words instead of raising. Nothing here writes, creates or locks anything
(a lock file some other tool keeps in the directory is simply not looked at).

These readers depend only on the run directory's documented layout (see
``evokernel/journal.py``: ``run.json``, ``config.yaml``, ``journal.jsonl``,
``sources/<id>.json``, ``snapshots/gen-N.json``, ``llm_outcomes.jsonl``, ``llm/``,
``optuna/``) and on the two core contracts, ``Candidate`` and ``Evaluation``; never on
the report modules, which may move.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status

log = logging.getLogger(__name__)

JOURNAL_FORMAT = 1
"""The newest journal line format these readers understand (``"v"`` of a line)."""
_SNAPSHOT = re.compile(r"^gen-(\d{6,})\.json$")


@dataclass(frozen=True)
class Evaluated:
    """One journal line, reduced to what the dashboard shows."""

    seq: int
    generation: int
    candidate_id: str
    name: str
    operator: str
    parents: tuple[str, ...]
    candidate_generation: int
    evaluation: Evaluation
    time: datetime | None

    @property
    def status(self) -> str:
        return self.evaluation.status.value

    @property
    def fitness(self) -> float | None:
        return self.evaluation.fitness

    @property
    def device_s(self) -> float:
        return self.evaluation.device_s


def parse_journal_line(raw: dict[str, Any]) -> Evaluated:
    """A decoded journal line as an ``Evaluated``; raises ``ValueError`` if it is not one."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    version = raw.get("v", 1)
    if not isinstance(version, int) or version > JOURNAL_FORMAT:
        raise ValueError(f"format {version!r} is newer than this dashboard's {JOURNAL_FORMAT}")
    try:
        candidate = raw["candidate"]
        evaluation = Evaluation.model_validate(raw["evaluation"])
        when = raw.get("time")
        return Evaluated(
            seq=int(raw["seq"]), generation=int(raw["gen"]), candidate_id=str(raw["id"]),
            name=str(candidate.get("name", "")), operator=str(candidate.get("operator", "")),
            parents=tuple(str(p) for p in candidate.get("parents", ())),
            candidate_generation=int(candidate.get("generation", raw["gen"])),
            evaluation=evaluation,
            time=datetime.fromisoformat(when) if isinstance(when, str) else None,
        )
    except (KeyError, TypeError, AttributeError, ValidationError) as exc:
        raise ValueError(str(exc).splitlines()[0] or type(exc).__name__) from None


@dataclass
class JournalFollower:
    """Follows ``journal.jsonl`` as it grows: each ``poll`` reads only the new bytes.

    A last line without its newline is still being written (or was torn by a kill):
    it is left unread and counted in ``torn_bytes``. A complete line that does not
    parse is skipped and named in ``corrupt``; the lines after it are still read. If
    the file shrinks or is replaced, reading starts again from the top.
    """

    path: Path
    records: list[Evaluated] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    torn_bytes: int = 0
    missing: bool = True
    resets: int = 0
    """How many times reading started again from the top (the file shrank or was replaced)."""
    _offset: int = 0
    _line_no: int = 0
    _inode: int | None = None

    def poll(self) -> bool:
        """Read what was appended since the last call; True if anything changed."""
        try:
            st = os.stat(self.path)
        except OSError:
            changed = not self.missing
            self._reset()
            self.missing = True
            return changed
        changed = self.missing
        self.missing = False
        if st.st_ino != self._inode or st.st_size < self._offset:
            changed = changed or self._offset > 0 or bool(self.corrupt)
            self._reset()
            self._inode = st.st_ino
        if st.st_size == self._offset + self.torn_bytes:
            return changed
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(st.st_size - self._offset)
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return changed
        complete, sep, tail = data.rpartition(b"\n")
        if not sep:
            complete, tail = b"", data
        for line in complete.split(b"\n") if sep else []:
            self._line_no += 1
            if not line.strip():
                continue
            try:
                self.records.append(parse_journal_line(json.loads(line)))
            except ValueError as exc:
                self.corrupt.append(f"line {self._line_no}: {exc}")
        self._offset += len(complete) + len(sep)
        self.torn_bytes = len(tail)
        return True

    def _reset(self) -> None:
        if self._offset or self.records or self.corrupt:
            self.resets += 1
        self.records = []
        self.corrupt = []
        self.torn_bytes = 0
        self._offset = 0
        self._line_no = 0
        self._inode = None


@dataclass
class JsonlFollower:
    """Follows a JSON-lines file of plain objects (``llm_outcomes.jsonl``) like the journal."""

    path: Path
    lines: list[dict[str, Any]] = field(default_factory=list)
    _offset: int = 0
    _size: int = -1

    def poll(self) -> bool:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            changed = bool(self.lines)
            self.lines, self._offset, self._size = [], 0, -1
            return changed
        if size == self._size:
            return False
        if size < self._offset:  # rewritten (a resumed run trims it): start again
            self.lines, self._offset = [], 0
        self._size = size
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return False
        complete, sep, _ = data.rpartition(b"\n")
        for line in complete.split(b"\n") if sep else []:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                self.lines.append(value)
        self._offset += len(complete) + len(sep)
        return True


def read_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)``, or ``(None, why)`` for a missing, torn or non-object file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"{path.name} does not exist (yet)"
    except OSError as exc:
        return None, f"cannot read {path.name}: {exc.strerror or exc}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"{path.name} is half-written or corrupt ({exc})"
    if not isinstance(data, dict):
        return None, f"{path.name} does not hold a JSON object"
    return data, None


def read_yaml(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """Like :func:`read_json`, for ``config.yaml``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path.name} does not exist (yet)"
    except (OSError, yaml.YAMLError) as exc:
        return None, f"{path.name} is unreadable ({str(exc).splitlines()[0]})"
    if not isinstance(data, dict):
        return None, f"{path.name} does not hold a mapping"
    return data, None


@dataclass
class SnapshotReader:
    """The newest readable ``snapshots/gen-N.json``; keeps the last good one on a bad read."""

    directory: Path
    data: dict[str, Any] | None = None
    problem: str | None = None
    _key: tuple[str, int, int] | None = None

    def poll(self) -> bool:
        for _ in range(3):  # the writer keeps the last few and deletes older ones meanwhile
            newest = self._newest()
            if newest is None:
                changed = self.data is not None
                self.data, self._key, self.problem = None, None, None
                return changed
            try:
                st = newest.stat()
            except FileNotFoundError:
                continue
            key = (newest.name, st.st_mtime_ns, st.st_size)
            if key == self._key:
                return False
            data, why = read_json(newest)
            if data is None and why is not None and "does not exist" in why:
                continue
            self._key = key
            if data is None:
                self.problem = f"snapshots/{why}; showing the one before"
            else:
                self.data, self.problem = data, None
            return True
        return False

    def _newest(self) -> Path | None:
        try:
            names = [p for p in self.directory.iterdir() if _SNAPSHOT.match(p.name)]
        except OSError:
            return None
        return max(names, key=lambda p: int(_SNAPSHOT.match(p.name).group(1)), default=None)  # type: ignore[union-attr]


def read_candidate(run_root: Path, candidate_id: str) -> tuple[Candidate | None, str | None]:
    """``sources/<id>.json`` as a ``Candidate``, or ``(None, why)``."""
    if not re.fullmatch(r"[0-9a-f]{6,64}", candidate_id):
        return None, f"{candidate_id!r} is not a candidate id"
    data, why = read_json(run_root / "sources" / f"{candidate_id}.json")
    if data is None:
        return None, why
    try:
        return Candidate.model_validate(data), None
    except ValidationError as exc:
        return None, f"sources/{candidate_id}.json is not a candidate ({str(exc).splitlines()[0]})"


def passed(status: str) -> bool:
    return status == Status.PASSED.value
