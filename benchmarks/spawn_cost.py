"""What a candidate's process costs to start: forked by the fork server, or a fresh interpreter.

    python benchmarks/spawn_cost.py --processes 8 [--device cuda]

Starts ``--processes`` confined candidate processes each way, side by side in one run
(the two ways alternate, one process at a time, each made ready as a spare is: its
first answer, then its round trip), and records per way the wall time from the request
to a ready process and the host's CPU time spent meanwhile (all cores, from
/proc/stat: the processes' own work and the kernel's for them), and the ratios. The
fork server's own start (importing torch once) is recorded apart, as ``server_start_s``.
A spare's start competes for the host's cores with the judge and the candidate being
clocked; on a 16-core H100 host a fresh interpreter took 8.1 s of wall time to start
while a dozen others started beside it (throughput-dsa_topk-spare_steps-h100-2026-12-06).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.record import write_result
from evokernel.evaluate.environment import fingerprint
from evokernel.evaluate.isolation import Isolation, probe
from evokernel.evaluate.process import CandidateHandle, ForkServer


def cpu_seconds() -> float:
    """Busy CPU time of the whole host so far (user, nice, system, irq, softirq), in s."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))
    return busy / os.sysconf("SC_CLK_TCK")


def start_one(device: str, isolation: Isolation, log: Path, forks: ForkServer | None) -> tuple[float, float]:
    """(wall s, host CPU s) to a ready process; the process is killed after."""
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    handle = CandidateHandle(device, isolation, log, forks=forks)
    handle.ready(120)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    handle.kill(30)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    isolation = probe(True, None if args.device != "cpu" else 8.0)
    logs = Path(tempfile.mkdtemp(prefix="spawn-cost-"))
    t0 = time.perf_counter()
    forks = ForkServer(args.device, isolation, logs / "server.log")
    server_start = time.perf_counter() - t0
    figures: dict[str, list[tuple[float, float]]] = {"forked": [], "fresh": []}
    rows = []
    try:
        for i in range(args.processes):
            for way in ("forked", "fresh"):
                took, spent = start_one(args.device, isolation, logs / f"{way}-{i}.log",
                                        forks if way == "forked" else None)
                figures[way].append((took, spent))
                rows.append({"way": way, "process": i, "wall_s": took, "host_cpu_s": spent})
                print(f"{way:6s} {i:3d}  ready in {took:6.3f} s, host CPU {spent:6.3f} s", flush=True)
    finally:
        forks.close()
    wall = {way: statistics.median(w for w, _ in values) for way, values in figures.items()}
    cpu = {way: statistics.median(c for _, c in values) for way, values in figures.items()}
    metrics: dict[str, object] = {
        "spawn.processes": args.processes, "spawn.server_start_s": server_start,
        "spawn.server_import_s": forks.import_s, "spawn.server_preloaded": forks.preloaded,
        **{f"spawn.{way}.wall_s_median": wall[way] for way in figures},
        **{f"spawn.{way}.host_cpu_s_median": cpu[way] for way in figures},
        "spawn.wall_ratio_fresh_over_forked": wall["fresh"] / wall["forked"],
        "spawn.cpu_ratio_fresh_over_forked": cpu["fresh"] / max(1e-3, cpu["forked"]),
    }
    for key, value in metrics.items():
        print(f"{key} = {value}")
    environment = {**fingerprint(torch.device(args.device)), "sandbox": isolation.describe()}
    path = write_result("spawn-cost", metrics, environment, rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
