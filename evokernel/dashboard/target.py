"""The directory the dashboard was pointed at: a run, a comparison, or one not started yet.

A run directory is recognised by ``run.json`` (written last when a run is created),
a comparison folder by ``comparison.json`` (written first). A directory that holds
neither may be one a search is about to fill; the page then says it is waiting.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from evokernel.dashboard.comparison_view import ComparisonView
from evokernel.dashboard.run_view import RunView


class NotARunError(ValueError):
    """A path the dashboard cannot follow; the message is one line for the user."""


def check(path: Path) -> Path:
    """``path`` if the dashboard can follow it, else ``NotARunError`` saying why."""
    if not path.exists():
        raise NotARunError(f"{path} does not exist")
    if not path.is_dir():
        raise NotARunError(f"{path} is not a directory (give a run directory or a comparison folder)")
    if (path / "comparison.json").exists() or (path / "run.json").exists():
        return path
    names = {p.name for p in path.iterdir()}
    if names and not names & {"config.yaml", "journal.jsonl", "sources", "snapshots", "runs"}:
        raise NotARunError(f"{path} is neither a run directory (run.json) nor a comparison folder "
                           "(comparison.json)")
    return path


class Target:
    """Decides, on each refresh until it knows, what the directory is, then follows it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.view: RunView | ComparisonView | None = None
        self._lock = threading.Lock()

    def refresh(self) -> None:
        with self._lock:
            if self.view is None:
                if (self.root / "comparison.json").exists():
                    self.view = ComparisonView(self.root)
                elif (self.root / "run.json").exists():
                    self.view = RunView(self.root)
        if self.view is not None:
            self.view.refresh()

    def state(self, run: str | None = None) -> dict[str, Any]:
        """The page model: the run's, or the comparison's with the chosen run's under ``run``."""
        self.refresh()
        if self.view is None:
            return {"kind": "waiting", "version": 0, "path": str(self.root),
                    "notices": [f"{self.root} holds no run.json or comparison.json yet: waiting for the "
                                "search to create it"]}
        state = dict(self.view.state())
        if isinstance(self.view, ComparisonView):
            chosen = self.run_view(run) if run else None
            if chosen is None and self.view.runs:
                chosen = self._first_started()
            state["selected"] = None if chosen is None else chosen.state()
        return state

    def run_view(self, run: str | None) -> RunView | None:
        """The run a request names: the run itself, or one of the comparison's by its key."""
        if isinstance(self.view, RunView):
            return self.view
        if isinstance(self.view, ComparisonView) and run:
            return self.view.run(run)
        return None

    def _first_started(self) -> RunView | None:
        assert isinstance(self.view, ComparisonView)
        started = [v for v in self.view.runs.values() if v.manifest is not None]
        return started[0] if started else next(iter(self.view.runs.values()), None)
