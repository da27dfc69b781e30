"""Print the few Nsight Compute figures that say where a kernel's time goes.

    python benchmarks/ncu_summary.py ncu-dsa_topk-cuda_family-details.csv

Reads the ``--page details --csv`` export of an ncu report (one row per metric per
launch) and prints one line per launch: duration, compute and memory throughput,
achieved occupancy, registers, and the section rules' notes on stalls, so that a
device call's log already tells the story without opening the report.
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

WANTED = {
    "Duration": "dur",
    "Compute (SM) Throughput": "sm%",
    "Memory Throughput": "mem%",
    "DRAM Throughput": "dram%",
    "Achieved Occupancy": "occ%",
    "Registers Per Thread": "regs",
    "Dynamic Shared Memory Per Block": "dsmem",
    "Waves Per SM": "waves",
    "Warp Cycles Per Issued Instruction": "cpi",
}


def summarise(path: Path) -> list[str]:
    text = path.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith('"ID"')), None)
    if start is None:
        return [f"{path}: no ncu details table (first line: {text[:1]})"]
    launches: dict[str, dict[str, str]] = defaultdict(dict)
    for row in csv.DictReader(text[start:]):
        launch = launches[row["ID"]]
        launch.setdefault("kernel", row.get("Kernel Name", "?").split("(")[0])
        launch.setdefault("grid", row.get("Grid Size", ""))
        launch.setdefault("block", row.get("Block Size", ""))
        name = row.get("Metric Name", "")
        if name in WANTED:
            launch[WANTED[name]] = f"{row.get('Metric Value', '')}{row.get('Metric Unit', '')}"
    lines = []
    for launch_id, launch in launches.items():
        figures = " ".join(f"{key}={launch[key]}" for key in WANTED.values() if key in launch)
        lines.append(f"{launch_id:>4} {launch['kernel']:14s} grid{launch['grid']} "
                     f"block{launch['block']} {figures}")
    return lines


def stalls(path: Path, top: int = 5) -> list[str]:
    """From the ``--page raw --csv`` export: each launch's largest warp-stall samples."""
    text = path.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(text[start:]))
    header, body = rows[0], rows[2:]  # the second row holds the units
    prefix = "smsp__pcsamp_warps_issue_stalled_"
    columns = [i for i, name in enumerate(header)
               if name.startswith(prefix) and not name.endswith("_not_issued")]
    lines = []
    for row in body:
        counts = []
        for i in columns:
            try:
                counts.append((float(row[i].replace(",", "")), header[i][len(prefix):]))
            except (ValueError, IndexError):
                continue
        total = sum(c for c, _ in counts) or 1.0
        best = sorted(counts, reverse=True)[:top]
        lines.append(f"{row[0]:>4} stalls: " + ", ".join(f"{n} {c / total:.0%}" for c, n in best))
    return lines


def main() -> int:
    for name in sys.argv[1:]:
        path = Path(name)
        for line in summarise(path):
            print(line)
        raw = path.with_name(path.name.replace("-details.csv", "-raw.csv"))
        if raw != path and raw.exists():
            for line in stalls(raw):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
