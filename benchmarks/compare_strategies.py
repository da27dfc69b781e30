"""Strategies at equal budget on a recorded landscape: evaluations to 95% of its best.

    python benchmarks/compare_strategies.py            # 5 strategies x 10 seeds, 120 evaluations each

Runs ``python -m evokernel.analysis.compare`` (Ray, one task per run, replaying
``workloads/dsa_topk/landscapes/cuda_family-h200.jsonl.xz`` by default), then reruns
it into a second folder and checks that every number is identical. Records, per
strategy, ``compare.strategies.<name>.evals_to_95pct`` (median over seeds, its 95%
bootstrap interval, and how many seeds reached the target; a median or bound above
the budget means "not reached within the budget"), ``compare.landscape_size``
(evaluations recorded), ``compare.unseen_candidates`` (proposals the landscape lacks),
``compare.wall_minutes`` (the first comparison, start to end, report included) and
``compare.rerun_identical``; the CSV beside it has one row per (strategy, seed) run.

Why 120 evaluations: the landscape is the full 1,155-point grid of seven of the
family's band-MS parameters, and the budget must stay well below it, or every strategy
could simply enumerate the grid. Repeats are free (the engine caches by candidate id),
so at 120 uniform random search sees about a tenth of the grid: a real chance at the
few points within 5% of the best, and room for a strategy that learns from what it
measured to show it needs fewer.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd

from benchmarks.record import write_result
from evokernel.analysis import compare

DEFAULT_LANDSCAPE = "workloads/dsa_topk/landscapes/cuda_family-h200.jsonl.xz"
NUMBERS = ("evaluations.csv", "report/strategies.csv", "report/to_target.csv", "report/pairwise_to_target.csv",
           "report/pairwise_final_best.csv", "report/operators.csv", "report/lineage.csv", "report/trajectory.csv")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="dsa_topk")
    p.add_argument("--landscape", default=DEFAULT_LANDSCAPE)
    p.add_argument("--strategies", default="evolutionary,map_elites,random,greedy,optuna")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--budget", type=int, default=120)
    p.add_argument("--runtime", default="ray")
    p.add_argument("--parallel", type=int)
    p.add_argument("--out", help="folder for the two comparisons (default runs/compare-bench-<time>)")
    p.add_argument("--no-rerun", action="store_true", help="skip the determinism rerun")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to compare")
    args = p.parse_args()

    root = Path(args.out or f"runs/compare-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    argv = ["--workload", args.workload, "--landscape", args.landscape, "--strategies", args.strategies,
            "--seeds", str(args.seeds), "--budget", str(args.budget), "--runtime", args.runtime, "--quiet"]
    argv += [f"--set={item}" for item in args.set]
    if args.parallel:
        argv += ["--parallel", str(args.parallel)]
    started = time.perf_counter()
    if compare.main([*argv, "--out", str(root / "first")]) != 0:
        return 1
    wall_minutes = (time.perf_counter() - started) / 60
    identical = None
    if not args.no_rerun:
        if compare.main([*argv, "--out", str(root / "rerun"), "--no-report"]) != 0:
            return 1
        from evokernel.analysis.report import build_report

        build_report(root / "rerun")
        identical = all((root / "first" / f).read_bytes() == (root / "rerun" / f).read_bytes() for f in NUMBERS)

    first = root / "first"
    manifest = json.loads((first / "comparison.json").read_text())
    per = pd.read_csv(first / "report" / "strategies.csv")
    reach = pd.read_csv(first / "report" / "to_target.csv")
    landscape = manifest["landscape"]
    metrics: dict[str, object] = {
        "compare.landscape_size": landscape["records"],
        "compare.landscape_best_fitness": landscape["best_fitness"],
        "compare.target_fitness": 0.95 * landscape["best_fitness"],
        "compare.budget_evaluations": args.budget,
        "compare.censored_value": args.budget + 1,
        "compare.seeds": args.seeds,
        "compare.unseen_candidates": manifest["unseen"],
        "compare.wall_minutes": wall_minutes,
        "compare.rerun_identical": identical,
    }
    for row in per.itertuples(index=False):
        key = f"compare.strategies.{row.strategy}.evals_to_95pct"
        metrics[f"{key}.median"] = float(row.cost_median)
        metrics[f"{key}.low"] = float(row.cost_low)
        metrics[f"{key}.high"] = float(row.cost_high)
        metrics[f"{key}.reached"] = f"{row.reached}/{row.seeds}"
        metrics[f"compare.strategies.{row.strategy}.final_best.median"] = float(row.final_median)
    outcomes = {(o["strategy"], o["seed"]): o for o in manifest["outcomes"]}
    rows = [{"strategy": r.strategy, "seed": r.seed, "reached_95pct": bool(r.reached),
             "evals_to_95pct": r.cost if r.reached else None, "final_best": r.final_best,
             "evaluations": r.evaluations, "stop_reason": outcomes[(r.strategy, r.seed)]["stop_reason"],
             "unseen": outcomes[(r.strategy, r.seed)]["unseen"],
             "wall_s": outcomes[(r.strategy, r.seed)]["wall_s"]} for r in reach.itertuples(index=False)]
    for key, value in metrics.items():
        print(f"{key} = {value}")
    device = (landscape.get("environment") or {}).get("device", "unknown")
    environment = {"device": f"replay of {device}", "host": platform.node(), "python": platform.python_version(),
                   "landscape_environment": json.dumps(landscape.get("environment") or {}, sort_keys=True)}
    extra = {"landscape": landscape["path"], "landscape_sha256": landscape["sha256"],
             "comparison_folder": str(first), "report": str(first / "report" / "summary.md")}
    print(f"wrote {write_result('compare-strategies', metrics, environment, rows, extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
