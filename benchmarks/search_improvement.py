"""Does a search from the seeds beat the best seed, and does it hold on held-out shapes?

    python benchmarks/search_improvement.py --workload dsa_topk --gpu-seconds 240 --budget 120

Runs ``python -m evokernel.search`` (Ray runtime) on the ``quick`` shapes from the
workload's seeds, then evaluates the best candidate found and the best seed afresh,
side by side in one evaluator, ``--rounds`` times each in alternating order (each side's
median evaluation counts), on the ``quick`` and the ``heldout`` shapes (the best
found: the one the search names from its ``--finalists`` best measured three more times
beside the best seed, ``evokernel/finalists.py``, not its single luckiest figure). Records
``search.improvement_over_best_seed`` (best found fitness / best seed fitness, quick),
``search.heldout_improvement`` (the same on heldout), ``search.gpu_seconds``,
``search.evaluations`` and ``search.best_found_lineage`` (the chain from a seed to the
best found: operator, what it changed, fitness); the CSV beside it is the best-so-far
trajectory, and ``best_candidate.json`` the best found, for ``seeds.py --best``. A search
whose finalists do not beat the best seed is recorded as well (``search.best_found``
None, the finalists' figures), and exits 0; the run's ``summary.md`` and
``finalists.json`` are copied beside the record either way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.landscape_record import latency_figures
from benchmarks.record import write_result
from evokernel.analysis.tables import lineage
from evokernel.evaluate.result import Evaluation
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.journal import RunDir
from evokernel.workload import load_workload


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="dsa_topk")
    parser.add_argument("--strategy", default="evolutionary")
    parser.add_argument("--budget", type=int, default=120)
    parser.add_argument("--gpu-seconds", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runtime", default="ray")
    parser.add_argument("--rounds", type=int, default=3,
                        help="evaluations of the best found and the best seed on each subset (alternating order)")
    parser.add_argument("--finalists", type=int, default=5,
                        help="best candidates of the search measured again (3 rounds, beside the best seed) "
                             "before one is named best")
    parser.add_argument("--quiet-graphs", action="store_true",
                        help="graph replays wait for starting spares, in the search and the side by side "
                             "(SandboxConfig.quiet_graphs)")
    args = parser.parse_args()

    out = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    run_dir = Path("/tmp") / f"search-{args.workload}-{int(time.time())}"
    command = [
        sys.executable, "-m", "evokernel.search", "--workload", args.workload,
        "--strategy", args.strategy, "--shapes", "quick", "--budget", str(args.budget),
        "--gpu-seconds", str(args.gpu_seconds), "--seed", str(args.seed),
        "--runtime", args.runtime, "--run-dir", str(run_dir), "--quiet", "--finalists", str(args.finalists),
        *(["--set", "evaluator.options.quiet_graphs=true"] if args.quiet_graphs else []),
    ]
    started = time.perf_counter()
    proc = subprocess.run(command, text=True)
    search_wall = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"search failed with exit code {proc.returncode}")
        return 1

    workload = load_workload(args.workload)
    run = RunDir.open(run_dir)
    records = run.records()
    seed_ids = {s.id for s in workload.seeds()}
    best_so_far, trajectory = 0.0, []
    for i, r in enumerate(records, 1):
        fit = r.evaluation.fitness
        if fit is not None:
            best_so_far = max(best_so_far, fit)
        trajectory.append({"evaluation": i, "candidate": r.candidate_id,
                           "status": r.evaluation.status.value, "fitness": fit,
                           "best_so_far": best_so_far, "device_s": r.evaluation.device_s,
                           "operator": r.candidate.get("operator"), "seed": r.candidate_id in seed_ids})
    passed = [r for r in records if r.evaluation.fitness is not None]
    best_seed = max((r for r in passed if r.candidate_id in seed_ids),
                    key=lambda r: r.evaluation.fitness or 0.0)

    # The search's single best figure is the luckiest of hundreds of noisy ones (a 571x
    # candidate re-measured at 459x, 2026-12-06): the search names its best from its
    # finalists measured again beside the best seed (evokernel/finalists.py); then the best
    # found and the best seed on quick and on the held-out shapes, in one evaluator.
    finals = json.loads((run_dir / "finalists.json").read_text())
    search_metrics = {
        "search.strategy": args.strategy,
        "search.evaluations": len(records),
        "search.gpu_seconds": sum(r.evaluation.device_s for r in records),
        "search.wall_seconds": search_wall,
        "search.best_seed_fitness_in_search": best_seed.evaluation.fitness,
        "search.finalists": finals["finalists"],
        "search.finalists_device_s": finals["device_s"],
        "search.confirmed_gain_quick": finals["gain_over_best_seed"],
        "search.confirmed_gain_quick_range": finals.get("gain_range"),
    }
    if (run_dir / "summary.md").is_file():  # the run's own account, beside the record
        (out / f"search-{args.workload}-summary.md").write_text((run_dir / "summary.md").read_text())
    # the search and its finalists recorded now; the complete record (same name) replaces
    # it after the side by side, and a stage cut short by its time limit still returns it
    environment = best_seed.evaluation.environment
    write_result(f"search-{workload.name}", {**search_metrics, "search.complete": False}, environment, trajectory)
    if not finals["best"] or finals["best"] == best_seed.candidate_id:
        # a search that finds nothing better is a result too: recorded, not an error
        print(f"no finalist beat the best seed once measured again: {finals}")
        metrics = {**search_metrics, "search.complete": True,
                   "search.best_seed": run.load_candidate(best_seed.candidate_id).name,
                   "search.best_found": None}
        print(f"wrote {write_result(f'search-{workload.name}', metrics, environment, trajectory)}")
        return 0
    best = next(r for r in passed if r.candidate_id == finals["best"])
    seed = run.load_candidate(best_seed.candidate_id)
    found = run.load_candidate(best.candidate_id)
    # now, not after the side by side: a stage cut short by its time limit still returns
    # the candidate found (attn_gpu_check.py --best reads it)
    (out / "best_candidate.json").write_text(found.model_dump_json(indent=1))
    # Rounds alternate which of the two goes first: in one fresh evaluator on 2026-12-06 the
    # candidate measured first came out 27% below its finalists' median, the seed after it
    # within its own. Each side's figure is its median evaluation over the rounds.
    config = SandboxConfig(timeout_s=300, seed=12345, quiet_graphs=args.quiet_graphs)
    with SandboxEvaluator(workload.name, config=config) as ev:
        fresh = {}
        for subset in ("quick", "heldout"):
            shapes = workload.resolve_shapes(subset)
            ev.warm_up(shapes)  # the baseline, the inputs and the spares before either is timed
            rounds: list[tuple[Evaluation, Evaluation]] = []
            for turn in range(args.rounds):
                order = (found, seed) if turn % 2 == 0 else (seed, found)
                got = {c.id: ev.evaluate(c, shapes) for c in order}
                rounds.append((got[found.id], got[seed.id]))
            print(f"{subset} rounds (found, seed): {[(f.fitness, s.fitness) for f, s in rounds]}")
            fresh[subset] = (median_evaluation([f for f, _ in rounds]), median_evaluation([s for _, s in rounds]))
        environment = ev.environment()
    for f in finals["finalists"]:
        print(f"finalist {f['candidate']}: in the search {f['in_search']}, confirmed {f['fitness']} "
              f"({[x['fitness'] for x in f['fresh']]})")
    for subset, (f, s) in fresh.items():
        print(f"{subset}: found {f.status.value} {f.fitness}  seed {s.status.value} {s.fitness}")

    def ratio(subset: str) -> float | None:
        f, s = fresh[subset]
        return f.fitness / s.fitness if f.fitness and s.fitness else None

    def cupti_mean_us(evaluation: Evaluation) -> float | None:
        """Mean CUPTI span over the shapes (FlashInfer-Bench's figure), where every shape has one."""
        figure: float | None = latency_figures(evaluation)["mean_latency_us_cupti"]
        return figure

    def cupti_ratio(subset: str) -> float | None:
        f, s = (cupti_mean_us(e) for e in fresh[subset])
        return s / f if f and s else None

    metrics = {
        **search_metrics,
        "search.complete": True,
        "search.best_seed": seed.name,
        "search.best_found": found.id,
        "search.best_found_fitness_in_search": best.evaluation.fitness,
        "search.best_found_params": found.params,
        "search.best_found_operator": found.operator,
        # the chain from a seed to the best found: which operators produced it, and what each changed
        "search.best_found_lineage": [
            {"operator": step.operator, "changed": step.changed,
             "fitness": None if math.isnan(step.fitness) else step.fitness}
            for step in lineage(run, of=best.candidate_id).itertuples()],
        "search.improvement_over_best_seed": ratio("quick"),
        "search.heldout_improvement": ratio("heldout"),
        "search.quick.found_fitness": fresh["quick"][0].fitness,
        "search.quick.seed_fitness": fresh["quick"][1].fitness,
        "search.heldout.found_fitness": fresh["heldout"][0].fitness,
        "search.heldout.seed_fitness": fresh["heldout"][1].fitness,
        # the same comparison by mean CUPTI kernel span (the latency figure)
        "search.quick.found_cupti_us": cupti_mean_us(fresh["quick"][0]),
        "search.quick.seed_cupti_us": cupti_mean_us(fresh["quick"][1]),
        "search.heldout.found_cupti_us": cupti_mean_us(fresh["heldout"][0]),
        "search.heldout.seed_cupti_us": cupti_mean_us(fresh["heldout"][1]),
        "search.heldout_improvement_cupti": cupti_ratio("heldout"),
    }
    for k, v in metrics.items():
        print(f"{k} = {v}")
    path = write_result(f"search-{workload.name}", metrics, environment, trajectory)
    print(f"wrote {path}")
    return 0


def median_evaluation(evaluations: list[Evaluation]) -> Evaluation:
    """The evaluation with the median fitness (the lower middle of an even count); a failed
    one stands for all if any failed."""
    failed = [e for e in evaluations if e.fitness is None]
    if failed:
        return failed[0]
    ranked = sorted(evaluations, key=lambda e: e.fitness or 0.0)
    return ranked[(len(ranked) - 1) // 2]


if __name__ == "__main__":
    sys.exit(main())
