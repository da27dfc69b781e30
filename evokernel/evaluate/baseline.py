"""The baseline of every speedup: the definition's published reference.

FlashInfer-Bench's speedup is the definition's own PyTorch reference over the
solution, both timed in the same run. evokernel does not ship that reference (it is
the benchmark's code, not ours): it reads it from the user's copy of the
FlashInfer-Trace data set, the way FlashInfer-Bench reads definitions from its data
set, found under ``definitions/`` of the folder named by ``trace_root`` (evaluator
option) or ``$EVOKERNEL_TRACE_ROOT``. It then runs it as FlashInfer-Bench does
(value-returning ``run(*inputs)``) in a candidate process, timed by the same judge
with the same method as every candidate. Where no data set is configured, the
baseline is the workload's own reference, and every shape result says which one
(``ShapeResult.baseline``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evokernel.evaluate.result import Timing

log = logging.getLogger(__name__)

TRACE_ROOT_VARIABLE = "EVOKERNEL_TRACE_ROOT"


class BaselineError(ValueError):
    """The configured baseline cannot be used (missing data set, or no reference in it)."""


@dataclass(frozen=True)
class Baseline:
    kind: str
    """``published`` or ``own``."""
    source: str
    """Python source defining ``run(*inputs)`` (value-returning)."""
    origin: str
    """Where it came from: a file path, or the workload's reference file."""


def trace_root(configured: str | os.PathLike[str] | None = None) -> Path | None:
    value = configured or os.environ.get(TRACE_ROOT_VARIABLE)
    return Path(value).expanduser() if value else None


def find_definition(root: Path, name: str) -> Path | None:
    """``definitions/**/<name>.json`` under a FlashInfer-Trace folder."""
    folder = root / "definitions"
    if not folder.is_dir():
        return None
    return next(iter(sorted(folder.rglob(f"{name}.json"))), None)


def published_reference(root: Path, definition_name: str) -> Baseline:
    path = find_definition(root, definition_name)
    if path is None:
        raise BaselineError(f"no definitions/**/{definition_name}.json under {root}")
    try:
        source = json.loads(path.read_text()).get("reference")
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{path}: {exc}") from exc
    if not isinstance(source, str) or "def run" not in source:
        raise BaselineError(f"{path} holds no reference with a run() function")
    return Baseline("published", source, str(path))


def choose(kind: str, definition_name: str, own_source: str, own_origin: str,
           configured_root: str | None = None) -> Baseline:
    """The baseline for ``kind``: ``published``, ``own``, or ``auto`` (published if found)."""
    if kind not in ("auto", "published", "own"):
        raise BaselineError(f"unknown baseline {kind!r} (auto, published or own)")
    if kind == "own":
        return Baseline("own", own_source, own_origin)
    root = trace_root(configured_root)
    if root is None:
        if kind == "published":
            raise BaselineError(
                f"baseline 'published' needs a FlashInfer-Trace folder: set {TRACE_ROOT_VARIABLE} "
                "or the evaluator option trace_root"
            )
        log.warning("no FlashInfer-Trace folder configured (%s): speedups are over the "
                    "workload's own reference, not the published one", TRACE_ROOT_VARIABLE)
        return Baseline("own", own_source, own_origin)
    return published_reference(root, definition_name)


class TimingStore:
    """Baseline timings by shape: in memory, and in a JSON file only the judge writes
    (its folder is closed to candidate processes), keyed by everything they depend on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._known: dict[str, Timing] = {}

    def get(self, shapes: Sequence[str], key: Callable[[str], str],
            measure: Callable[[list[str]], dict[str, Timing]]) -> dict[str, Timing]:
        """Each shape's timing, measuring (with ``measure``) only those never measured."""
        cached: dict[str, Any] = {}
        if self.path.exists():
            try:
                cached = json.loads(self.path.read_text())
            except (OSError, ValueError):
                cached = {}
        missing = []
        for shape in shapes:
            if shape in self._known:
                continue
            if key(shape) in cached:
                self._known[shape] = Timing.model_validate(cached[key(shape)])
            else:
                missing.append(shape)
        if missing:
            for shape, timing in measure(missing).items():
                self._known[shape] = timing
                cached[key(shape)] = timing.model_dump(mode="json")
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        return {s: self._known[s] for s in shapes}
