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
from evokernel.testing import FakeEvaluator, FakeWorkload


def one(gpus: int, delay: float, budget: int) -> float:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 * 2**20, address="local")
    try:
        runtime = RayRuntime(lambda: FakeEvaluator(delay_s=delay, gpu=True))
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
        done = len(run.records())
        runtime.close()
    finally:
        ray.shutdown()
    return done / wall * 60


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="1,2,4,8")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--budget", type=int, default=48)
    args = parser.parse_args()
    counts = [int(x) for x in args.gpus.split(",")]
    rows = []
    for n in counts:
        rate = one(n, args.delay, args.budget)
        rows.append({"gpus": n, "candidates_per_min": rate})
        print(f"{n} fake GPUs: {rate:.1f} candidates/min", flush=True)
    base = rows[0]["candidates_per_min"] / counts[0]
    for r in rows:
        r["efficiency"] = r["candidates_per_min"] / (r["gpus"] * base)
    metrics = {
        "scaling.kind": "fake GPUs (Ray logical resources) on a CPU machine; sleep-based evaluator",
        "scaling.delay_s": args.delay,
        "scaling.gpus": counts,
        "scaling.candidates_per_min": [r["candidates_per_min"] for r in rows],
        "scaling.efficiency": [r["efficiency"] for r in rows],
    }
    for r in rows:
        print(f"{r['gpus']}: {r['candidates_per_min']:.1f}/min, efficiency {r['efficiency']:.2f}")
    print(f"wrote {write_result('scaling-fake-gpus', metrics, {'device': 'cpu'}, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
