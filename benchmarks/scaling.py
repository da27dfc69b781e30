"""Throughput of the engine's evaluator pool against the number of (fake) GPUs.

    python benchmarks/scaling.py --gpus 1,2,4,8 --delay 0.5 --budget 48

No multi-GPU machine was lent, so this measures only what a CPU machine can: a local
Ray instance that advertises N logical GPUs, one evaluator actor per GPU, and a fake
evaluator that holds its "GPU" for ``--delay`` seconds per candidate. The same search
(same seed, same budget in evaluations, batch = 2 x N) runs for each N. It shows
whether the engine keeps N evaluators busy (dispatch, result shipping, the single
strategy in the driver); it says nothing about timing interference between real
GPUs. Records ``scaling.gpus``, ``scaling.candidates_per_min`` and
``scaling.efficiency`` (throughput on N / (N x throughput on 1)).

``--jitter J`` spreads each candidate's delay over ``delay x [1 - J, 1 + J]`` (fixed
per candidate), as real evaluations differ in length.

To say what is in the way, each run's wall time is split three ways: the evaluators'
own time if all N were busy throughout (the delays' sum / N), the loss to the
generational barrier (each generation lasts until its last evaluation ends: the FIFO
makespan of its delays on N slots, so its last round runs part-empty, the seeds'
generation most of all), and the rest, the engine's own overhead between
evaluations (ask, tell, journal, snapshot, Ray calls).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.engine import Budget, Engine
from evokernel.journal import RunDir
from evokernel.runtime import RayRuntime
from evokernel.strategies import StrategyEnv, make_strategy
from evokernel.testing import FakeEvaluator, FakeWorkload, fake_delay


def fifo_makespan(delays: list[float], slots: int) -> float:
    """When the last of ``delays`` ends if each starts on the first free slot, in order."""
    free = [0.0] * slots
    for d in delays:
        i = min(range(slots), key=free.__getitem__)
        free[i] += d
    return max(free, default=0.0)


def one(gpus: int, delay: float, budget: int, jitter: float) -> dict[str, float]:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 * 2**20, address="local")
    try:
        runtime = RayRuntime(lambda: FakeEvaluator(delay_s=delay, delay_jitter=jitter, gpu=True))
        # Start every evaluator actor before the clock starts: a process start costs
        # about a second on this machine, which is a start-up cost, not throughput.
        ray.get([actor.has.remote("evaluate") for actor in runtime._actors])
        seeds = FakeWorkload().seeds()
        run = RunDir.create(Path(tempfile.mkdtemp()) / "run", {"strategy": "random"},
                            {"seeds": [s.id for s in seeds]})
        env = StrategyEnv(seeds, 0, "fake", host=runtime.host, run_dir=run.root)
        engine = Engine(make_strategy("random", env, None), runtime, run, seeds, ["s0"],
                        Budget(evaluations=budget), batch_size=2 * gpus)
        started = time.perf_counter()
        engine.run()
        wall = time.perf_counter() - started
        records = run.records()
        runtime.close()
    finally:
        ray.shutdown()
    done = len(records)
    by_generation: dict[int, list[tuple[int, float]]] = {}
    for r in records:  # the fake's delay is a function of the candidate: recompute it
        d = fake_delay(r.candidate_id, delay, jitter)
        by_generation.setdefault(r.generation, []).append((r.index, d))
    busy = sum(d for g in by_generation.values() for _, d in g) / gpus
    generational = sum(fifo_makespan([d for _, d in sorted(g)], gpus) for g in by_generation.values())
    return {"gpus": gpus, "candidates_per_min": done / wall * 60, "wall_s": wall,
            "all_busy_s": busy, "barrier_s": generational - busy, "engine_s": wall - generational}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="1,2,4,8")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--budget", type=int, default=48)
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="spread each evaluation's delay over delay x [1 - j, 1 + j]")
    args = parser.parse_args()
    counts = [int(x) for x in args.gpus.split(",")]
    rows = []
    for n in counts:
        row = one(n, args.delay, args.budget, args.jitter)
        rows.append(row)
        print(f"{n} fake GPUs: {row['candidates_per_min']:.1f} candidates/min; wall {row['wall_s']:.1f} s ="
              f" {row['all_busy_s']:.1f} all busy + {row['barrier_s']:.1f} barrier"
              f" + {row['engine_s']:.1f} engine", flush=True)
    base = rows[0]["candidates_per_min"] / counts[0]
    for r in rows:
        r["efficiency"] = r["candidates_per_min"] / (r["gpus"] * base)
    metrics = {
        "scaling.kind": "fake GPUs (Ray logical resources) on a CPU machine; sleep-based evaluator",
        "scaling.delay_s": args.delay,
        "scaling.delay_jitter": args.jitter,
        "scaling.gpus": counts,
        "scaling.candidates_per_min": [r["candidates_per_min"] for r in rows],
        "scaling.efficiency": [r["efficiency"] for r in rows],
        "scaling.barrier_s": [r["barrier_s"] for r in rows],
        "scaling.engine_overhead_s": [r["engine_s"] for r in rows],
    }
    for r in rows:
        print(f"{r['gpus']}: {r['candidates_per_min']:.1f}/min, efficiency {r['efficiency']:.2f}")
    name = "scaling-fake-gpus" + (f"-jitter{args.jitter:g}" if args.jitter else "")
    print(f"wrote {write_result(name, metrics, {'device': 'cpu'}, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
