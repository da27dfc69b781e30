"""Every seed of a workload on every shape: correctness and speedup over the reference.

    python benchmarks/seeds.py --workload dsa_topk --shapes all

Records ``<workload>.seeds_correct_all_shapes``, ``<workload>.best_seed_mean_speedup``
(arithmetic mean of per-shape speedups of the best seed, the contest's aggregate),
``<workload>.best_seed_fitness`` (geometric mean), ``<workload>.reference_mean_ms``,
and per seed and shape the latencies in the CSV beside the JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.workload import load_workload


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="dsa_topk")
    parser.add_argument("--shapes", default="all")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--only", default=None, help="comma-separated seed names")
    args = parser.parse_args()

    workload = load_workload(args.workload)
    shapes = workload.resolve_shapes(args.shapes)
    seeds = workload.seeds()
    if args.only:
        seeds = [s for s in seeds if s.name in args.only.split(",")]
    rows = []
    summary = {}
    with SandboxEvaluator(workload.name, config=SandboxConfig(timeout_s=args.timeout)) as ev:
        reference = ev.reference_timings(shapes)
        for seed in seeds:
            started = time.perf_counter()
            result = ev.evaluate(seed, shapes)
            n_passed = sum(s.status.value == "PASSED" for s in result.shapes)
            print(
                f"{seed.name:24s} {result.status.value:12s} {n_passed}/{len(shapes)} shapes "
                f"fitness={result.fitness} mean={result.mean_speedup} "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
            if result.status.value != "PASSED":
                print("   ", result.feedback[:2000], flush=True)
            summary[seed.name] = result
            for s in result.shapes:
                rows.append({
                    "seed": seed.name, "shape": s.shape, "status": s.status.value,
                    "batch_size": workload.shapes[s.shape].axes["batch_size"],
                    "max_num_pages": workload.shapes[s.shape].axes["max_num_pages"],
                    "latency_us": s.timing.median_ms * 1e3 if s.timing else None,
                    "p25_us": s.timing.p25_ms * 1e3 if s.timing else None,
                    "p75_us": s.timing.p75_ms * 1e3 if s.timing else None,
                    "e2e_us": s.timing.e2e_ms * 1e3 if s.timing else None,
                    "method": s.timing.method if s.timing else None,
                    "reference_ms": reference[s.shape].median_ms,
                    "speedup": s.speedup,
                })
        environment = ev.environment()

    passed = {n: e for n, e in summary.items() if e.fitness is not None}
    best = max(passed, key=lambda n: passed[n].mean_speedup or 0.0) if passed else None
    name = workload.name
    metrics = {
        f"{name}.seeds_correct_all_shapes": len(passed) == len(summary) and args.shapes == "all",
        f"{name}.shapes": len(shapes),
        f"{name}.reference_mean_ms": sum(t.median_ms for t in reference.values()) / len(reference),
        f"{name}.best_seed": best,
        f"{name}.best_seed_mean_speedup": passed[best].mean_speedup if best else None,
        f"{name}.best_seed_fitness": passed[best].fitness if best else None,
    }
    for seed_name, e in summary.items():
        metrics[f"{name}.seeds.{seed_name}.status"] = e.status.value
        metrics[f"{name}.seeds.{seed_name}.mean_speedup"] = e.mean_speedup
        metrics[f"{name}.seeds.{seed_name}.fitness"] = e.fitness
    path = write_result(f"seeds-{name}", metrics, environment, rows)
    print(f"wrote {path}")
    return 0 if len(passed) == len(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
