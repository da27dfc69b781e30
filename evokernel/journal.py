"""The run directory: the one place a run's future is decided from.

Layout (format version ``FORMAT``)::

    run.json              manifest: format, workload, seed, environment fingerprint
    config.yaml           the resolved config the run uses (resume reads it back)
    journal.jsonl         append-only, one line per evaluation, fsynced
    sources/<id>.json     every evaluated candidate, content-addressed by its id
    snapshots/gen-N.json  strategy + engine state after generation N (atomic)
    optuna/               Optuna JournalStorage files (tuning, the Optuna strategy)
    llm/                  recorded LLM exchanges by request hash (llm.mode record), evals/ of the agent
    llm_outcomes.jsonl    one line per LLM operator proposal: outcome, child, tokens, requests,
                          and the agent's own (uncharged) tool evaluations

Every file except the journal is written to a temporary name and renamed into
place, so a kill -9 leaves either the old or the new version; a new run directory is
built under a hidden temporary name and renamed into place whole, so it exists
complete or not at all. The journal may end in a torn line (a kill while it was
written): it is ignored, its evaluation is redone, and it is cut off before the next
append. Opening a run only reads: a bad run directory is reported in one line and
left as it was. A run that is being written holds a lock on its directory
(``lock()``), so a second search on it stops with an error naming the holder.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.files import (
    DirectoryLock,
    LockHeld,
    atomic_write,
    atomic_write_json,
    fsync_dir,
    now,
    process_alive,
)

logger = logging.getLogger(__name__)

FORMAT = 1
KEEP_SNAPSHOTS = 3
_SNAPSHOT = re.compile(r"^gen-(\d{6,})\.json$")


class RunDirError(Exception):
    """A run directory that cannot be created, opened or resumed; the message says why."""


@dataclass(frozen=True)
class Record:
    """One journal line: an evaluation, where it happened, and the candidate (no sources)."""

    seq: int
    generation: int
    index: int
    candidate_id: str
    evaluation: Evaluation
    candidate: dict[str, Any]


class RunDir:
    """A run directory on disk. Build with :meth:`create` or :meth:`open`."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest
        self._torn_at: int | None = None
        self._seq: int | None = None
        self._lock = DirectoryLock(root)

    # -- paths -------------------------------------------------------------------------
    @property
    def journal_path(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def sources_dir(self) -> Path:
        return self.root / "sources"

    @property
    def snapshots_dir(self) -> Path:
        return self.root / "snapshots"

    @property
    def optuna_dir(self) -> Path:
        return self.root / "optuna"

    @property
    def llm_outcomes_path(self) -> Path:
        return self.root / "llm_outcomes.jsonl"

    # -- create / open -----------------------------------------------------------------
    @classmethod
    def create(cls, root: str | Path, config: dict[str, Any], manifest: dict[str, Any],
               seeds: Sequence[Candidate] = (), *, lock: bool = False) -> RunDir:
        """A new run directory holding the config, the manifest and the seeds' sources.

        It is written under a hidden temporary name beside ``root`` and renamed into
        place (replacing an empty directory), so a kill leaves no half-made run. With
        ``lock`` the new run is locked for this process (see :meth:`lock`).
        """
        root = Path(root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise RunDirError(f"{root} already exists and is not empty; use --resume {root} to continue it")
        root.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(root)
        tmp = root.parent / f".{root.name}.creating-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        run = cls(tmp, {"format": FORMAT, "created": now(), "environment": {}, "environment_history": [],
                        **manifest})
        try:
            if lock:
                run.lock()
            for sub in ("sources", "snapshots", "optuna"):
                (tmp / sub).mkdir()
            atomic_write(tmp / "config.yaml", yaml.safe_dump(config, sort_keys=False))
            (tmp / "journal.jsonl").touch()
            for seed in seeds:
                run.write_source(seed)
            atomic_write_json(tmp / "run.json", run.manifest)
            fsync_dir(tmp)
            os.rename(tmp, root)
            fsync_dir(root.parent)
        except OSError as exc:
            run.unlock()
            shutil.rmtree(tmp, ignore_errors=True)
            raise RunDirError(f"cannot create {root}: {exc.strerror or exc}") from None
        except BaseException:
            run.unlock()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        run.root = root
        run._lock.moved(root)
        return run

    @classmethod
    def open(cls, root: str | Path) -> RunDir:
        """Open an existing run for resuming; reads only, raises ``RunDirError`` if unusable."""
        root = Path(root)
        if not root.is_dir():
            raise RunDirError(f"{root} is not a directory")
        manifest_path = root / "run.json"
        if not manifest_path.is_file():
            raise RunDirError(f"{root} is not an evokernel run directory (no run.json)")
        manifest = _read_json(manifest_path, "run manifest")
        _check_format(manifest, manifest_path)
        for name in ("config.yaml", "journal.jsonl"):
            if not (root / name).is_file():
                raise RunDirError(f"{root} is an incomplete run directory: {name} is missing")
        run = cls(root, manifest)
        run.records()  # validate the journal now, before anything is written
        run.latest_snapshot()
        return run

    def config(self) -> dict[str, Any]:
        try:
            data = yaml.safe_load(self.config_path.read_text())
        except OSError as exc:
            raise RunDirError(f"cannot read {self.config_path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1})" if where is not None else ""
            raise RunDirError(f"{self.config_path} is corrupt: not valid YAML{at}") from None
        if not isinstance(data, dict):
            raise RunDirError(f"{self.config_path} is corrupt: it does not hold a config mapping")
        return data

    def seed_ids(self) -> list[str]:
        """The ids of the run's seeds, as the manifest lists them."""
        seeds = self.manifest.get("seeds")
        if not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds):
            raise RunDirError(f"{self.root / 'run.json'} is corrupt: no list of seed ids")
        return seeds

    # -- the lock ------------------------------------------------------------------------
    def lock(self) -> None:
        """Hold this run for this process until :meth:`unlock` or the process ends (even
        by kill -9). Raises ``RunDirError`` naming the process that holds it."""
        try:
            self._lock.acquire()
        except LockHeld as held:
            raise RunDirError(f"{self.root} is in use by {held}; wait for it to end or stop it first") from None

    def unlock(self) -> None:
        self._lock.release()

    # -- environment -------------------------------------------------------------------
    @property
    def environment(self) -> dict[str, str]:
        return dict(self.manifest.get("environment") or {})

    def set_environment(self, env: dict[str, str]) -> None:
        if self.manifest.get("environment"):
            self.manifest.setdefault("environment_history", []).append(
                {"until": now(), "environment": self.manifest["environment"]}
            )
        self.manifest["environment"] = dict(env)
        atomic_write_json(self.root / "run.json", self.manifest)

    # -- journal -----------------------------------------------------------------------
    def records(self) -> list[Record]:
        """Every complete journal record. A torn last line is ignored with a warning."""
        out = list(self._scan())
        self._seq = len(out)
        return out

    def _scan(self) -> Iterator[Record]:
        try:
            data = self.journal_path.read_bytes()
        except OSError as exc:
            raise RunDirError(f"cannot read {self.journal_path}: {exc}") from exc
        complete, sep, tail = data.rpartition(b"\n")
        if tail and self._torn_at is None:
            # Only newline-terminated lines were fully written; the rest was in flight.
            logger.warning("%s: ignoring a torn last line (%d bytes); its evaluation was in flight "
                           "and will be redone", self.journal_path, len(tail))
        if tail:
            self._torn_at = len(complete) + len(sep)
        for n, line in enumerate(complete.split(b"\n") if complete else [], start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if raw.get("v", 1) > FORMAT:
                    raise RunDirError(
                        f"{self.journal_path}: line {n} has format {raw['v']}, newer than this "
                        f"evokernel's {FORMAT}"
                    )
                yield Record(
                    seq=raw["seq"],
                    generation=raw["gen"],
                    index=raw["index"],
                    candidate_id=raw["id"],
                    evaluation=Evaluation.model_validate(raw["evaluation"]),
                    candidate=raw["candidate"],
                )
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise RunDirError(f"{self.journal_path}: line {n} is corrupt ({exc})") from exc

    def append(self, generation: int, index: int, candidate: Candidate, evaluation: Evaluation) -> int:
        """Journal one evaluation (source first, then the line); returns its sequence number."""
        if self._seq is None:
            self.records()
        if self._torn_at is not None:
            with open(self.journal_path, "r+b") as f:
                f.truncate(self._torn_at)
            self._torn_at = None
        self.write_source(candidate)
        seq = self._seq or 0
        line = {
            "v": FORMAT,
            "seq": seq,
            "gen": generation,
            "index": index,
            "id": candidate.id,
            "candidate": candidate.model_dump(mode="json", exclude={"sources"}),
            "evaluation": evaluation.model_dump(mode="json"),
            "time": now(),
        }
        with open(self.journal_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._seq = seq + 1
        return seq

    @property
    def next_seq(self) -> int:
        """Sequence number of the next journal line (= complete lines so far)."""
        if self._seq is None:
            self.records()
        return self._seq or 0

    def write_source(self, candidate: Candidate) -> None:
        path = self.sources_dir / f"{candidate.id}.json"
        if not path.exists():
            atomic_write_json(path, candidate.model_dump(mode="json"))

    def load_candidate(self, candidate_id: str) -> Candidate:
        path = self.sources_dir / f"{candidate_id}.json"
        data = _read_json(path, "candidate source")
        try:
            return Candidate.model_validate(data)
        except ValidationError as exc:
            raise RunDirError(f"candidate source {path} is corrupt: {_first_error(exc)}") from None

    # -- snapshots ---------------------------------------------------------------------
    def write_snapshot(self, generation: int, state: dict[str, Any]) -> Path:
        path = self.snapshots_dir / f"gen-{generation:06d}.json"
        atomic_write_json(path, {"format": FORMAT, "generation": generation, "written": now(), **state})
        for old in self._snapshot_files()[:-KEEP_SNAPSHOTS]:
            old.unlink(missing_ok=True)
        return path

    def _snapshot_files(self) -> list[Path]:
        if not self.snapshots_dir.is_dir():
            return []
        files = [p for p in self.snapshots_dir.iterdir() if _SNAPSHOT.match(p.name)]
        return sorted(files, key=lambda p: int(_SNAPSHOT.match(p.name).group(1)))  # type: ignore[union-attr]

    def latest_snapshot(self) -> dict[str, Any] | None:
        """The newest snapshot the journal covers, or None before the first generation ended.

        A snapshot names how many journal lines it covers. If the journal's last line
        was torn after the newest snapshot was written (the file was cut short), that
        snapshot is one line ahead: the one before it is used, and the generations
        after it are replayed from the journal and redone where the line is missing.
        """
        files = self._snapshot_files()
        complete = self.next_seq
        for path in reversed(files):
            data = _read_json(path, "snapshot")
            _check_format(data, path)
            for key in ("generation", "journal_seq", "strategy", "spent", "engine"):
                if key not in data:
                    raise RunDirError(f"snapshot {path} is incomplete: no {key!r}")
            if not isinstance(data["journal_seq"], int):
                raise RunDirError(f"snapshot {path} is corrupt: journal_seq is not a number")
            if data["journal_seq"] <= complete:
                if path != files[-1]:
                    logger.warning("%s is ahead of the journal, whose last line was torn; resuming from %s",
                                   files[-1].name, path.name)
                return data
            if self._torn_at is None or data["journal_seq"] > complete + 1:
                raise RunDirError(f"snapshot {path} is ahead of the journal: the journal was truncated")
        if files:
            logger.warning("%s is ahead of the journal, whose last line was torn; replaying the run "
                           "from its start", files[-1].name)
        return None


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunDirError(f"cannot read {what} {path}: {exc}") from exc
    except ValueError as exc:
        raise RunDirError(f"{what} {path} is corrupt or truncated: {exc}") from exc
    if not isinstance(data, dict):
        raise RunDirError(f"{what} {path} is corrupt: not a JSON object")
    return data


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "(top level)"
    return f"{where}: {first['msg']}"


def _remove_abandoned(root: Path) -> None:
    """Remove what a create of ``root`` killed midway left (its process is gone)."""
    for tmp in root.parent.glob(f".{root.name}.creating-*"):
        pid = tmp.name.rsplit("-", 2)[-2]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _check_format(data: dict[str, Any], path: Path) -> None:
    version = data.get("format")
    if not isinstance(version, int):
        raise RunDirError(f"{path} has no format version; it was not written by evokernel")
    if version > FORMAT:
        raise RunDirError(
            f"{path} has format {version}, newer than this evokernel's {FORMAT}; upgrade to resume it"
        )
