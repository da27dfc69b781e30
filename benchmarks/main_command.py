"""Time the README's main command with its defaults, as a new user would run it.

    python benchmarks/main_command.py

Runs ``python -m evokernel.search --workload dsa_topk`` (only ``--run-dir`` added, so
the run can be read back) and records ``main_command.wall_minutes``,
``main_command.evaluations`` and the count of each status, from the run's journal.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.journal import RunDir


def main() -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="evokernel-main-")) / "run"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "evokernel.search", "--workload", "dsa_topk", "--run-dir", str(run_dir)],
        capture_output=True, text=True,
    )
    wall = time.perf_counter() - started
    print(proc.stdout[-3000:])
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return 1
    run = RunDir.open(run_dir)
    records = run.records()
    statuses = collections.Counter(r.evaluation.status.value for r in records)
    best = max((r.evaluation.fitness or 0.0 for r in records), default=0.0)
    metrics = {
        "main_command.wall_minutes": wall / 60,
        "main_command.evaluations": len(records),
        "main_command.best_fitness": best,
        **{f"main_command.status.{k}": v for k, v in sorted(statuses.items())},
    }
    for k, v in metrics.items():
        print(f"{k} = {v}")
    environment = records[0].evaluation.environment if records else {"device": "cpu"}
    print(f"wrote {write_result('main-command', metrics, environment)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
