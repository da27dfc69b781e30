"""What a run says when it stops: its top candidates, on the terminal and in ``summary.md``.

Two aggregates of a candidate's per-shape speedups over the reference stand side by
side, and each is named for what it is: the **fitness** is their geometric mean (what
the search maximises: one shape cannot buy the rest), the **mean speedup** their
arithmetic mean (the contest's figure). A candidate that did not pass every shape has
neither; it is shown with a dash, never as 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evokernel.engine import Engine
from evokernel.files import atomic_write
from evokernel.journal import RunDir
from evokernel.llm.outcomes import OutcomeLog

FITNESS = "fitness (geomean speedup)"
MEAN = "mean speedup (arithmetic)"
MEANING = ("fitness: geometric mean of the per-shape speedups over the reference; mean speedup: their "
           "arithmetic mean; only a candidate that passed every shape has either.")


@dataclass(frozen=True)
class TopRow:
    rank: int
    candidate: str
    status: str
    fitness: float | None
    mean_speedup: float | None
    name: str
    operator: str
    changed: str
    """Parameters that differ from their declared defaults (``(defaults)`` if none)."""

    def cells(self) -> list[str]:
        return [str(self.rank), self.candidate, self.status, _num(self.fitness), _num(self.mean_speedup),
                f"{self.name} / {self.operator}", self.changed]


HEADER = ["#", "candidate", "status", FITNESS, MEAN, "name / operator", "params changed from the defaults"]


def top_rows(engine: Engine, directory: RunDir, top: int) -> list[TopRow]:
    """The ``top`` best candidates of the run, best first."""
    rows = []
    for i, (cid, ev) in enumerate(engine.ranked()[:top], start=1):
        cand = engine.candidates.get(cid) or directory.load_candidate(cid)
        declared = {**cand.knob_space, **cand.launch_space}
        changed = " ".join(f"{k}={v}" for k, v in sorted(cand.params.items())
                           if k not in declared or v != declared[k].initial) or "(defaults)"
        rows.append(TopRow(i, cid, ev.status.value, ev.fitness, ev.mean_speedup, cand.name, cand.operator, changed))
    return rows


def llm_lines(directory: RunDir, llm_operators: Sequence[Any]) -> list[str]:
    """Per LLM operator: proposals, children, and how many of those passed; token use."""
    outcomes = OutcomeLog(directory.llm_outcomes_path).lines()
    if not outcomes and not llm_operators:
        return []
    status = {r.candidate_id: r.evaluation.status.value for r in directory.records()}
    by_op: dict[str, Counter[str]] = {}
    for line in outcomes:
        row = by_op.setdefault(line["operator"], Counter())
        row["asked"] += 1
        if line.get("child"):
            row["children"] += 1
            row["passed"] += status.get(line["child"]) == "PASSED"
    parts = [f"{name}: {r['asked']} asked, {r['children']} children, {r['passed']} passed"
             for name, r in sorted(by_op.items())]
    lines = ["LLM operators: " + ("; ".join(parts) or "not asked")]
    if llm_operators:
        budget = llm_operators[0].client.budget.summary()
        lines.append(f"LLM tokens: {budget['total_tokens']} in {budget['calls']} requests"
                     f" (est. ${budget['cost_usd']}); outcomes: {directory.llm_outcomes_path}")
    return lines


def write_summary(engine: Engine, directory: RunDir, *, reason: str, top: int, shapes: Sequence[str],
                  outputs: dict[str, Path], llm: Sequence[str] = (), finals: Sequence[str] = ()) -> Path:
    """``summary.md`` in the run directory: what ran, why it stopped, the top candidates
    (by the search's own figures), and ``finals``, the finalists measured again."""
    m = directory.manifest
    records = directory.records()
    counts = Counter(r.evaluation.status.value for r in records)
    spent = engine.state.spent
    lines = [
        f"# Run {directory.root.name}", "",
        f"Workload {m.get('workload', '?')}, strategy {m.get('strategy', '?')}, seed {m.get('seed', '?')}, "
        f"on {len(shapes)} shapes. Stopped: {reason} after generation {engine.state.generation}: "
        f"{spent.evaluations} evaluations, {spent.device_s:.1f} device seconds.", "",
        "Statuses: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none") + ".", "",
        "## Top candidates", "", MEANING, "",
        "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER),
    ]
    for row in top_rows(engine, directory, top):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |")
    if finals:
        lines += ["", "## Finalists, measured again", "", finals[0], "", *(f"- {x.strip()}" for x in finals[1:])]
    if llm:
        lines += ["", "## LLM operators", "", *llm]
    if outputs:
        lines += ["", "## Files", ""]
        lines += [f"- {what}: `{path.name}`" for what, path in outputs.items()]
    path = directory.root / "summary.md"
    atomic_write(path, "\n".join(lines) + "\n")
    return path


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
