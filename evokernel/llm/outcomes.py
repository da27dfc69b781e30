"""The journal of LLM proposals: ``<run>/llm_outcomes.jsonl``, one line per proposal.

Each line holds the generation, the outcome (a child, or why none), the child's id,
tokens, the requests' keys, and the agent's own tool evaluations (journaled here, not
charged to the budget). Lines are appended and fsynced; a torn last line is skipped.
A resumed run asks the generations after its snapshot again (answered from the
recording), so it first drops their lines (:meth:`OutcomeLog.trim`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evokernel.evaluate.result import Evaluation
from evokernel.files import atomic_write, now

FORMAT = 1


class OutcomeLog:
    """The ``llm_outcomes.jsonl`` file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, generation: int, record: dict[str, Any],
               agent_evaluations: Mapping[str, Evaluation] | None = None) -> None:
        """Journal one LLM proposal (an ``OutcomeRecord.to_json()``) of ``generation``."""
        line = {"v": FORMAT, "gen": generation, **record, "time": now(), "agent_evaluations": {
            cid: {"status": ev.status.value, "fitness": ev.fitness, "device_s": ev.device_s}
            for cid, ev in (agent_evaluations or {}).items()
        }}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def lines(self) -> list[dict[str, Any]]:
        """Every complete line (a torn last one is skipped)."""
        try:
            data = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out = []
        for line in data.split("\n")[:-1]:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def trim(self, last_generation: int) -> int:
        """Drop the lines of generations after ``last_generation``; returns how many."""
        lines = self.lines()
        keep = [x for x in lines if int(x.get("gen", 0)) <= last_generation]
        if not self.path.exists() or (len(keep) == len(lines) and self.path.read_text().endswith("\n")):
            return 0
        atomic_write(self.path, "".join(json.dumps(x, sort_keys=True) + "\n" for x in keep))
        return len(lines) - len(keep)
