"""What the dashboard shows of a comparison folder (``python -m evokernel.analysis.compare --out``).

``comparison.json`` names every (strategy, seed) run and its directory before any
of them starts (``evokernel/analysis/compare.py``); each run is an ordinary run directory,
followed here by its own ``RunView``. The overview is each strategy's best-so-far
over its seeds, as a median with a min-max band, over evaluations and over device
seconds. A run still going counts only up to where it has got (so a band is honest
while the runs are still going); a finished run keeps its final best to the end of
the axis, as the report's curves do. A seed with no passed candidate yet counts as
fitness 0 there, as the report does.
"""

from __future__ import annotations

import bisect
import statistics
import threading
from pathlib import Path
from typing import Any

from evokernel.dashboard.files import read_json
from evokernel.dashboard.run_view import RunView

DEVICE_GRID = 120
"""Points of the device-seconds axis of the bands."""


class ComparisonView:
    """A comparison folder followed read-only; ``run(key)`` gives one run's ``RunView``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest: dict[str, Any] | None = None
        self.problem: str | None = None
        self.runs: dict[str, RunView] = {}
        self.meta: dict[str, dict[str, Any]] = {}
        self.version = 0
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._state: dict[str, Any] | None = None

    def refresh(self) -> bool:
        """Re-read ``comparison.json`` if it changed and refresh every run; True if anything did."""
        with self._lock:
            changed = self._read_manifest()
            for view in self.runs.values():
                changed = view.refresh() or changed
            if changed or self._state is None:
                self.version += 1
                self._state = self._build()
            return changed

    def state(self) -> dict[str, Any]:
        if self._state is None:
            self.refresh()
        assert self._state is not None
        return self._state

    def run(self, key: str) -> RunView | None:
        return self.runs.get(key)

    def _read_manifest(self) -> bool:
        path = self.root / "comparison.json"
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._stamp and stamp is not None:
            return False
        data, why = read_json(path)
        self._stamp = stamp
        if data is None:
            self.problem = f"{why}; showing what was read before" if self.manifest else why
            return True
        self.manifest, self.problem = data, None
        for entry in data.get("runs") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("dir"), str):
                continue
            key = entry["dir"]
            target = (self.root / key).resolve()
            if self.root.resolve() not in target.parents:
                continue  # a run directory must lie inside the comparison folder
            self.meta[key] = {"strategy": str(entry.get("strategy")), "seed": entry.get("seed")}
            if key not in self.runs:
                self.runs[key] = RunView(target, label=key)
        return True

    def _build(self) -> dict[str, Any]:
        m = self.manifest or {}
        finished = {(o.get("strategy"), o.get("seed")): o for o in m.get("outcomes") or [] if isinstance(o, dict)}
        runs = []
        for key, view in self.runs.items():
            s = view.state()
            meta = self.meta[key]
            started = view.manifest is not None
            outcome = finished.get((meta["strategy"], meta["seed"]))
            runs.append({"key": key, **meta, "evaluations": s["evaluations"],
                         "device_s": s["budget"]["device_s"]["spent"],
                         "best": None if s["best"] is None else s["best"]["fitness"],
                         "state": "done" if outcome else "running" if started else "waiting",
                         "stop_reason": outcome.get("stop_reason") if outcome else None,
                         "notices": len(s["notices"])})
        strategies = [str(x) for x in m.get("strategies") or sorted({r["strategy"] for r in runs})]
        notices = [self.problem] if self.problem else []
        notices += [f"{r['key']}: {n}" for r in runs for n in self.runs[r["key"]].state()["notices"]
                    if r["state"] != "waiting"]
        return {
            "kind": "comparison", "version": self.version, "path": str(self.root),
            "workload": m.get("workload"), "strategies": strategies, "seeds": m.get("seeds") or [],
            "budget": m.get("budget"), "created": m.get("created"), "command": m.get("command"),
            "finished": "outcomes" in m, "runs": runs,
            "bands": {s: _band_by_evaluations([(self.runs[r["key"]], r["state"] == "done") for r in runs
                                               if r["strategy"] == s]) for s in strategies},
            "bands_device": _bands_by_device({s: [(self.runs[r["key"]], r["state"] == "done") for r in runs
                                                  if r["strategy"] == s] for s in strategies}),
            "notices": notices,
        }


def _band(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def _band_by_evaluations(views: list[tuple[RunView, bool]]) -> dict[str, list[Any]]:
    """Median and min-max of best-so-far after each evaluation; ``views``: (run, finished)."""
    curves = [([b if b is not None else 0.0 for b in v.state()["series"]["best"]], done) for v, done in views]
    out: dict[str, list[Any]] = {"x": [], "median": [], "low": [], "high": [], "seeds": []}
    for i in range(max((len(c) for c, _ in curves), default=0)):
        at = [c[min(i, len(c) - 1)] for c, done in curves if len(c) > i or (done and c)]
        med, low, high = _band(at)
        out["x"].append(i + 1)
        out["median"].append(med)
        out["low"].append(low)
        out["high"].append(high)
        out["seeds"].append(len(at))
    return out


def _bands_by_device(views: dict[str, list[tuple[RunView, bool]]]) -> dict[str, dict[str, list[Any]]]:
    """The same over a grid of device seconds, from 0 to the most any run has spent."""
    spans = [v.state()["series"]["device_s"] for vs in views.values() for v, _ in vs]
    top = max((s[-1] for s in spans if s), default=0.0)
    if top <= 0:
        return {s: {"x": [], "median": [], "low": [], "high": [], "seeds": []} for s in views}
    grid = [top * i / DEVICE_GRID for i in range(DEVICE_GRID + 1)]
    out = {}
    for strategy, vs in views.items():
        band: dict[str, list[Any]] = {"x": grid, "median": [], "low": [], "high": [], "seeds": []}
        series = [(v.state()["series"], done) for v, done in vs]
        for x in grid:
            at = []
            for s, done in series:
                spent = s["device_s"]
                if not spent or (spent[-1] < x and not done):
                    continue
                k = bisect.bisect_right(spent, x) - 1  # the last evaluation within x
                at.append(0.0 if k < 0 or s["best"][k] is None else s["best"][k])
            med, low, high = _band(at)
            band["median"].append(med)
            band["low"].append(low)
            band["high"].append(high)
            band["seeds"].append(len(at))
        out[strategy] = band
    return out
