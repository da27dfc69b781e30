"""The red-team suite table (candidates/suite.yaml), shared by the tests and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from evokernel.evaluate.result import Status

CANDIDATES = Path(__file__).parent / "candidates"


@dataclass(frozen=True)
class Case:
    file: str
    expected: dict[str, Status]
    says: str

    @property
    def path(self) -> Path:
        return CANDIDATES / self.file


def load_suite() -> list[Case]:
    rows = yaml.safe_load((CANDIDATES / "suite.yaml").read_text())
    return [
        Case(row["file"], {d: Status(row[d]) for d in ("cpu", "cuda") if d in row}, row["says"])
        for row in rows
    ]


def cases_for(device: str) -> list[Case]:
    return [c for c in load_suite() if device in c.expected]
