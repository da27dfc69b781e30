"""benchmarks/spawn_cost.py: both ways of starting a candidate's process, side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_records_both_ways_side_by_side(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "benchmarks/spawn_cost.py", "--processes", "1"], cwd=REPO,
                          env={**os.environ, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = tmp_path.glob("spawn-cost-cpu-*.json")
    metrics = json.loads(record.read_text())["metrics"]["spawn"]
    assert metrics["processes"] == 1
    for way in ("forked", "fresh"):
        assert metrics[way]["wall_s_median"] > 0
    assert metrics["wall_ratio_fresh_over_forked"] > 0
    rows = (tmp_path / record.name.replace(".json", ".csv")).read_text().splitlines()
    assert len(rows) == 3 and "forked" in rows[1] and "fresh" in rows[2]
