"""Replaying recorded evaluations: an Evaluator that needs no GPU.

A landscape is a JSON-lines file of ``{"candidate", "evaluation", "shapes"}`` records
measured on a real device (``benchmarks/evaluator_throughput.py`` writes one; a run's
journal has the same records). Files ending in ``.xz`` or ``.gz`` are read compressed:
every record repeats its candidate's sources, which xz stores once (a 701-point landscape
of 95 KB records, 67 MB, takes 0.7 MB as ``.jsonl.xz``, 18 MB gzipped). Replaying it lets
strategies be compared on a CPU machine with real numbers. A candidate that was never measured is not invented: it
comes back ``SKIPPED`` with a feedback saying so, and ``unseen`` counts it.
"""

from __future__ import annotations

import gzip
import json
import lzma
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status


class LandscapeError(ValueError):
    """A landscape file that is missing or malformed."""


LANDSCAPE_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz")
"""The names a landscape file may have; the suffix says how it is compressed."""


def read_landscape_text(path: Path) -> str:
    """The JSON lines of a landscape file, decompressed by its suffix; OSError as open's."""
    if path.suffix == ".xz":
        try:
            return lzma.decompress(path.read_bytes()).decode()
        except lzma.LZMAError as exc:
            raise OSError(f"cannot decompress it as xz ({exc})") from exc
    if path.suffix == ".gz":
        try:
            return gzip.decompress(path.read_bytes()).decode()
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise OSError(f"cannot decompress it as gzip ({exc})") from exc
    return path.read_text()


def read_landscape(path: Path) -> list[tuple[Candidate, Evaluation, list[str]]]:
    """(candidate, evaluation, shapes) of every record of a landscape file, in file order;
    LandscapeError for a file that cannot be read, a malformed record or no record."""
    try:
        lines = read_landscape_text(path).splitlines()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise LandscapeError(f"cannot read landscape {path}: {exc}") from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            records.append((
                Candidate.model_validate(data["candidate"]),
                Evaluation.model_validate(data["evaluation"]),
                list(data.get("shapes") or [s["shape"] for s in data["evaluation"]["shapes"]]),
            ))
        except (ValueError, KeyError, TypeError) as exc:
            raise LandscapeError(f"{path}:{number}: not a landscape record ({exc})") from exc
    if not records:
        raise LandscapeError(f"landscape {path} holds no records")
    return records


class ReplayEvaluator:
    """Answers from a recorded landscape; charges the recorded device seconds."""

    def __init__(self, records: Iterable[tuple[Candidate, Evaluation, Sequence[str]]]) -> None:
        self._by_id: dict[str, tuple[Candidate, Evaluation, frozenset[str]]] = {}
        self.shape_sets: dict[frozenset[str], tuple[str, ...]] = {}
        """Each set of shapes some record was measured on, in its first record's order."""
        for candidate, evaluation, shapes in records:
            self._by_id[candidate.id] = (candidate, evaluation, frozenset(shapes))
            self.shape_sets.setdefault(frozenset(shapes), tuple(shapes))
        self.unseen: set[str] = set()
        self.environment_fingerprint: dict[str, str] = next(
            (e.environment for _, e, _ in self._by_id.values() if e.environment), {}
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayEvaluator:
        return cls(read_landscape(Path(path)))

    def __len__(self) -> int:
        return len(self._by_id)

    def candidates(self) -> list[Candidate]:
        return [c for c, _, _ in self._by_id.values()]

    def best(self) -> tuple[Candidate, Evaluation] | None:
        scored = [(c, e) for c, e, _ in self._by_id.values() if e.fitness is not None]
        return max(scored, key=lambda ce: ce[1].fitness or 0.0) if scored else None

    def environment(self) -> dict[str, str]:
        return dict(self.environment_fingerprint)

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        record = self._by_id.get(candidate.id)
        if record is None:
            self.unseen.add(candidate.id)
            return Evaluation(
                candidate_id=candidate.id, status=Status.SKIPPED,
                feedback="not in the recorded landscape: no measurement exists, none is invented",
            )
        _, evaluation, recorded_shapes = record
        missing = set(shapes) - recorded_shapes
        if missing:
            self.unseen.add(candidate.id)
            return Evaluation(
                candidate_id=candidate.id, status=Status.SKIPPED,
                feedback=f"the landscape has no measurement on {len(missing)} of these shapes",
            )
        if evaluation.status is not Status.PASSED or set(shapes) == recorded_shapes:
            return evaluation
        wanted = set(shapes)
        data = evaluation.model_dump()
        data["shapes"] = [s for s in data["shapes"] if s["shape"] in wanted]
        return Evaluation.model_validate(data)

    def close(self) -> None:
        return None
