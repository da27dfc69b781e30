"""Writing a recorded result the way ../shared/DESIGN.md asks: one JSON per figure set.

Scripts call :func:`write_result`; it writes ``<what>-<device>-<date>.json`` (and a
CSV of raw rows beside it) into ``$OUT`` when that is set (the GPU machine sends
back only that folder), else into benchmarks/results/.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _commit() -> str:
    if os.environ.get("EVOKERNEL_COMMIT"):
        return os.environ["EVOKERNEL_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{'a.b': 1} -> {'a': {'b': 1}}: metrics are nested by dotted name."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def write_result(
    what: str,
    metrics: dict[str, Any],
    environment: dict[str, str],
    rows: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    device = environment.get("device", "cpu")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device.replace("NVIDIA ", "")).strip("-").lower()
    date = dt.date.today().isoformat()
    folder = Path(os.environ.get("OUT") or RESULTS)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{what}-{slug}-{date}"
    document: dict[str, Any] = {
        "command": "python " + " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "commit": _commit(),
        "device": device,
        "date": date,
        "env": environment,
        "metrics": nest(metrics),
    }
    if rows:
        import pandas as pd

        csv = folder / f"{stem}.csv"
        pd.DataFrame(rows).to_csv(csv, index=False)
        document["raw"] = csv.name
    document.update(extra or {})
    path = folder / f"{stem}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
