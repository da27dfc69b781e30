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
place, so a kill -9 leaves either the old or the new version. The journal may end
in a torn line; it is ignored (with a warning) and cut off before the next append.
Opening a run only reads: a bad run directory is reported and left as it was.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation

FORMAT = 1
KEEP_SNAPSHOTS = 3
_SNAPSHOT = re.compile(r"^gen-(\d{6,})\.json$")


class RunDirError(Exception):
    """A run directory that cannot be created, opened or resumed; the message says why."""


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, sort_keys=True, indent=1) + "\n")


@dataclass(frozen=True)
class Record:
    """One journal line: an evaluation, where it happened, and the candidate (no sources)."""

    seq: int
    generation: int
    index: int
    candidate_id: str
    evaluation: Evaluation
    candidate: dict[str, Any]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunDir:
    """A run directory on disk. Build with :meth:`create` or :meth:`open`."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest
        self._torn_at: int | None = None
        self._seq: int | None = None

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
    def create(cls, root: str | Path, config: dict[str, Any], manifest: dict[str, Any]) -> RunDir:
        root = Path(root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise RunDirError(f"{root} already exists and is not empty; use --resume {root} to continue it")
        for sub in ("", "sources", "snapshots", "optuna"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        full = {"format": FORMAT, "created": now(), "environment": {}, "environment_history": [], **manifest}
        atomic_write(root / "config.yaml", yaml.safe_dump(config, sort_keys=False))
        (root / "journal.jsonl").touch()
        atomic_write_json(root / "run.json", full)  # last: its presence marks a run
        return cls(root, full)

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
        except (OSError, yaml.YAMLError) as exc:
            raise RunDirError(f"{self.config_path} is unreadable: {exc}") from exc
        if not isinstance(data, dict):
            raise RunDirError(f"{self.config_path} does not hold a config mapping")
        return data

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
            warnings.warn(
                f"{self.journal_path}: ignoring a torn last line ({len(tail)} bytes); "
                "its evaluation was in flight and will be redone",
                stacklevel=3,
            )
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

    # -- LLM outcomes ------------------------------------------------------------------
    def append_llm_outcome(self, generation: int, record: dict[str, Any],
                           agent_evaluations: dict[str, Evaluation] | None = None) -> None:
        """Journal one LLM proposal (an ``OutcomeRecord.to_json()``) of ``generation``."""
        line = {"v": FORMAT, "gen": generation, **record, "time": now(), "agent_evaluations": {
            cid: {"status": ev.status.value, "fitness": ev.fitness, "device_s": ev.device_s}
            for cid, ev in (agent_evaluations or {}).items()
        }}
        with open(self.llm_outcomes_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def llm_outcomes(self) -> list[dict[str, Any]]:
        """Every complete line of ``llm_outcomes.jsonl`` (a torn last one is skipped)."""
        try:
            data = self.llm_outcomes_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out = []
        for line in data.split("\n")[:-1]:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def trim_llm_outcomes(self, last_generation: int) -> int:
        """Drop the lines of generations after ``last_generation`` (a resumed run asks those
        again, from its recording); returns how many were dropped."""
        lines = self.llm_outcomes()
        keep = [x for x in lines if int(x.get("gen", 0)) <= last_generation]
        if not self.llm_outcomes_path.exists() or (len(keep) == len(lines) and
                                                   self.llm_outcomes_path.read_text().endswith("\n")):
            return 0
        atomic_write(self.llm_outcomes_path, "".join(json.dumps(x, sort_keys=True) + "\n" for x in keep))
        return len(lines) - len(keep)

    def write_source(self, candidate: Candidate) -> None:
        path = self.sources_dir / f"{candidate.id}.json"
        if not path.exists():
            atomic_write_json(path, candidate.model_dump(mode="json"))

    def load_candidate(self, candidate_id: str) -> Candidate:
        data = _read_json(self.sources_dir / f"{candidate_id}.json", "candidate source")
        return Candidate.model_validate(data)

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
        """The newest snapshot, or None before the first generation ended."""
        files = self._snapshot_files()
        if not files:
            return None
        data = _read_json(files[-1], "snapshot")
        _check_format(data, files[-1])
        for key in ("generation", "journal_seq", "strategy", "spent"):
            if key not in data:
                raise RunDirError(f"snapshot {files[-1]} is incomplete: no {key!r}")
        if data["journal_seq"] > (self._seq if self._seq is not None else len(self.records())):
            raise RunDirError(f"snapshot {files[-1]} is ahead of the journal: the journal was truncated")
        return data


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


def _check_format(data: dict[str, Any], path: Path) -> None:
    version = data.get("format")
    if not isinstance(version, int):
        raise RunDirError(f"{path} has no format version; it was not written by evokernel")
    if version > FORMAT:
        raise RunDirError(
            f"{path} has format {version}, newer than this evokernel's {FORMAT}; upgrade to resume it"
        )
