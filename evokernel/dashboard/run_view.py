"""What the dashboard shows of one run directory, rebuilt as the run's files grow.

``RunView.refresh()`` is called before every answer; it reads only what changed
(new journal bytes, a newer snapshot) and returns whether anything did.
``RunView.state()`` is the page's model: best-so-far series over evaluations and
device seconds (overall and per island), status counts, rate, budget, the lineage
of the best candidate, MAP-Elites grids, island summaries and Optuna studies.
Problems with the files (a torn last journal line, a corrupt line, a half-written
snapshot) are sentences in ``notices``, never exceptions.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evokernel.dashboard import lineage, optuna_studies, populations
from evokernel.dashboard.files import (
    Evaluated,
    JournalFollower,
    JsonlFollower,
    SnapshotReader,
    read_json,
    read_yaml,
)

RECENT_S = 300.0
"""Window of the recent evaluation rate (seconds of journal time before now)."""
MIN_SPAN_S = 10.0


class RunView:
    """A run directory followed read-only; safe to call from several threads."""

    def __init__(self, root: Path, label: str | None = None) -> None:
        self.root = root
        self.label = label or root.name
        self.journal = JournalFollower(root / "journal.jsonl")
        self.snapshots = SnapshotReader(root / "snapshots")
        self.outcomes = JsonlFollower(root / "llm_outcomes.jsonl")
        self.studies = optuna_studies.StudyFiles(root / "optuna")
        self.manifest: dict[str, Any] | None = None
        self.config: dict[str, Any] | None = None
        self.problems: list[str] = []
        self.version = 0
        self._by_id: dict[str, Evaluated] = {}
        self._indexed = 0
        self._resets = 0
        self._lock = threading.Lock()
        self._state: dict[str, Any] | None = None
        self._populations: dict[str, Any] = {"homes": {}, "islands": [], "map_elites": []}
        """What the newest snapshot says of the populations (re-read only when it changes)."""
        self.finalists: dict[str, Any] | None = None
        """``finalists.json`` (``evokernel/finalists.py``): written when the budget is spent
        (again by a resumed run, which removes the old one first)."""
        self._finalists_stamp: tuple[int, int] | None = None

    # -- reading ---------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read what changed on disk; True (and a new ``version``) if anything did."""
        with self._lock:
            changed = False
            if self.manifest is None or self.config is None:  # both are written once, at creation
                manifest, why_manifest = read_json(self.root / "run.json")
                config, why_config = read_yaml(self.root / "config.yaml")
                changed = (manifest, config) != (self.manifest, self.config)
                self.manifest, self.config = manifest, config
                self.problems = [w for w in (why_manifest, why_config) if w]
            if self.journal.poll():
                changed = True
                if self.journal.resets != self._resets:  # the journal was replaced: index anew
                    self._by_id, self._indexed, self._resets = {}, 0, self.journal.resets
                for record in self.journal.records[self._indexed:]:
                    self._by_id.setdefault(record.candidate_id, record)
                self._indexed = len(self.journal.records)
            if self.snapshots.poll():
                changed = True
                strategy = (self.snapshots.data or {}).get("strategy")
                self._populations = {"homes": populations.homes(strategy), "islands": populations.islands(strategy),
                                     "map_elites": populations.map_elites(strategy)}
            changed = self.outcomes.poll() or changed
            changed = self.studies.poll() or changed
            changed = self._poll_finalists() or changed
            if changed or self._state is None:
                self.version += 1
                self._state = self._build()
            return changed

    def _poll_finalists(self) -> bool:
        """Re-read ``finalists.json`` when it appears, changes or goes (written atomically)."""
        try:
            st = (self.root / "finalists.json").stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._finalists_stamp:
            return False
        self._finalists_stamp = stamp
        self.finalists = read_json(self.root / "finalists.json")[0] if stamp else None
        return True

    def state(self) -> dict[str, Any]:
        """The page model as of the last ``refresh`` (refreshing first if never done)."""
        if self._state is None:
            self.refresh()
        assert self._state is not None
        return self._state

    def record(self, candidate_id: str) -> Evaluated | None:
        return self._by_id.get(candidate_id)

    def llm_outcomes_of(self, candidate_id: str) -> list[dict[str, Any]]:
        return [x for x in self.outcomes.lines if x.get("child") == candidate_id]

    def recording_dir(self) -> Path:
        llm = (self.config or {}).get("llm") or {}
        where = llm.get("recording_dir") if isinstance(llm, dict) else None
        return Path(where) if isinstance(where, str) and where else self.root / "llm"

    # -- the model ---------------------------------------------------------------------------
    def _build(self) -> dict[str, Any]:
        records = list(self.journal.records)
        manifest, config = self.manifest or {}, self.config or {}
        snapshot = self.snapshots.data
        series = _series(records, self._populations["homes"])
        best = max((r for r in records if r.fitness is not None), key=lambda r: r.fitness or 0.0, default=None)
        return {
            "kind": "run",
            "version": self.version,
            "label": self.label,
            "path": str(self.root),
            "workload": manifest.get("workload") or config.get("workload"),
            "strategy": manifest.get("strategy") or config.get("strategy"),
            "seed": manifest.get("seed", config.get("seed")),
            "created": manifest.get("created"),
            "environment": manifest.get("environment") or {},
            "evaluations": len(records),
            "generation": None if snapshot is None else snapshot.get("generation"),
            "snapshot_written": None if snapshot is None else snapshot.get("written"),
            "best": None if best is None else _brief(best),
            "status_counts": dict(Counter(r.status for r in records)),
            "rate": _rate(records),
            "budget": _budget(config, series),
            "series": series,
            "islands": self._populations["islands"],
            "map_elites": self._populations["map_elites"],
            "lineage": lineage.ancestry(best.candidate_id if best else None, self._by_id, self.root),
            "optuna": self.studies.summaries(),
            "llm": _llm_totals(self.outcomes.lines),
            "finalists": self.finalists,
            "notices": self._notices(),
        }

    def _notices(self) -> list[str]:
        out = list(self.problems)
        j = self.journal
        if j.missing:
            out.append("journal.jsonl does not exist yet: the run has not started evaluating")
        if j.torn_bytes:
            out.append(f"journal.jsonl ends in a partly written line ({j.torn_bytes} bytes): shown up to the "
                       "last complete line. A running search finishes it; a killed one cuts it off on resume.")
        if j.corrupt:
            shown = "; ".join(j.corrupt[:3]) + (f"; and {len(j.corrupt) - 3} more" if len(j.corrupt) > 3 else "")
            out.append(f"journal.jsonl has {len(j.corrupt)} corrupt line(s), skipped here ({shown}). "
                       "The search will refuse to resume this run until they are repaired.")
        if self.snapshots.problem:
            out.append(self.snapshots.problem)
        out.extend(self.studies.problems)
        return out


def _brief(r: Evaluated) -> dict[str, Any]:
    return {"id": r.candidate_id, "name": r.name, "operator": r.operator, "fitness": r.fitness,
            "status": r.status, "generation": r.generation, "seq": r.seq}


def _series(records: list[Evaluated], homes: dict[str, int]) -> dict[str, Any]:
    """Per evaluation: cost axes, fitness, best so far, and the island it belongs to."""
    spent, best = 0.0, None
    out: dict[str, list[Any]] = {k: [] for k in ("index", "device_s", "fitness", "best", "id", "status",
                                                 "operator", "island", "time")}
    for n, r in enumerate(records, start=1):
        spent += r.device_s
        if r.fitness is not None and (best is None or r.fitness > best):
            best = r.fitness
        out["index"].append(n)
        out["device_s"].append(round(spent, 6))
        out["fitness"].append(r.fitness)
        out["best"].append(best)
        out["id"].append(r.candidate_id)
        out["status"].append(r.status)
        out["operator"].append(r.operator)
        out["island"].append(populations.island_of(r.candidate_id, r.parents, homes))
        out["time"].append(None if r.time is None else r.time.isoformat())
    return out


def _rate(records: list[Evaluated]) -> dict[str, Any]:
    """Evaluations per minute over the whole run and over the last ``RECENT_S`` seconds.

    Journal times have one-second resolution, so a rate over less than ``MIN_SPAN_S``
    is not given (None) rather than wildly wrong.
    """
    times = [r.time for r in records if r.time is not None]
    if not times:
        return {"per_minute": None, "recent_per_minute": None, "first": None, "last": None}
    first, last = min(times), max(times)
    span = (last - first).total_seconds()
    now = datetime.now(timezone.utc) if last.tzinfo else datetime.now()
    window = min(RECENT_S, (now - first).total_seconds())
    recent = sum(1 for t in times if (now - t).total_seconds() <= window)
    return {
        "per_minute": (len(times) - 1) / span * 60.0 if span >= MIN_SPAN_S else None,
        "recent_per_minute": recent / window * 60.0 if window >= MIN_SPAN_S else None,
        "first": first.isoformat(), "last": last.isoformat(),
    }


def _budget(config: dict[str, Any], series: dict[str, Any]) -> dict[str, Any]:
    raw = config.get("budget")
    budget: dict[str, Any] = raw if isinstance(raw, dict) else {}
    limit_evals = budget.get("evaluations") if isinstance(budget.get("evaluations"), int) else None
    limit_device = budget.get("gpu_seconds")
    return {
        "evaluations": {"spent": len(series["index"]), "limit": limit_evals},
        "device_s": {"spent": series["device_s"][-1] if series["device_s"] else 0.0,
                     "limit": float(limit_device) if isinstance(limit_device, (int, float)) else None},
    }


def _llm_totals(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not lines:
        return None
    by_op: dict[str, Counter[str]] = {}
    tokens = 0
    for x in lines:
        by_op.setdefault(str(x.get("operator")), Counter())[str(x.get("outcome"))] += 1
        tokens += int(x.get("tokens") or 0)
    return {"proposals": len(lines), "tokens": tokens,
            "operators": {op: dict(c) for op, c in sorted(by_op.items())}}
