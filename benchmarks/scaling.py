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
evaluations (ask, tell, journal, snapshot, Ray calls). Each N also runs pipelined
(``pipeline: true``: ``ask`` runs one generation ahead of ``tell``), side by side, and the ratio
of the two throughputs is recorded.
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
from evokernel.run import build
from evokernel.runtime import RayRuntime
from evokernel.testing import FakeEvaluator, fake_config, fake_delay


def fifo_makespan(delays: list[float], slots: int) -> float:
    """When the last of ``delays`` ends if each starts on the first free slot, in order."""
    free = [0.0] * slots
    for d in delays:
        i = min(range(slots), key=free.__getitem__)
        free[i] += d
    return max(free, default=0.0)


def one(gpus: int, delay: float, budget: int, jitter: float, pipeline: bool) -> dict[str, float | None]:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 * 2**20, address="local")
    try:
        runtime = RayRuntime(lambda: FakeEvaluator(delay_s=delay, delay_jitter=jitter, gpu=True))
        # Start every evaluator actor before the clock starts: a process start costs
        # about a second on this machine, which is a start-up cost, not throughput.
        ray.get([actor.has.remote("evaluate") for actor in runtime._actors])
        config = fake_config("random", budget=budget, batch_size=2 * gpus, pipeline=pipeline)
        config = config.model_copy(update={"run_dir": str(Path(tempfile.mkdtemp()) / "run")})
        with build(config, runtime=runtime) as run:
            started = time.perf_counter()
            run.run()
            wall = time.perf_counter() - started
            records = run.directory.records()
        runtime.close()
    finally:
        ray.shutdown()
    done = len(records)
    by_generation: dict[int, list[tuple[int, float]]] = {}
    for r in records:  # the fake's delay is a function of the candidate: recompute it
        d = fake_delay(r.candidate_id, delay, jitter)
        by_generation.setdefault(r.generation, []).append((r.index, d))
    busy = sum(d for g in by_generation.values() for _, d in g) / gpus
    row: dict[str, float | None] = {"gpus": gpus, "pipeline": float(pipeline), "candidates_per_min": done / wall * 60,
                                    "wall_s": wall, "all_busy_s": busy, "barrier_s": None, "engine_s": None}
    if not pipeline:  # generations overlap when pipelined: no per-generation makespan to subtract
        generational = sum(fifo_makespan([d for _, d in sorted(g)], gpus) for g in by_generation.values())
        row.update(barrier_s=generational - busy, engine_s=wall - generational)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="1,2,4,8")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--budget", type=int, default=48)
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="spread each evaluation's delay over delay x [1 - j, 1 + j]")
    args = parser.parse_args()
    counts = [int(x) for x in args.gpus.split(",")]
    rows: list[dict[str, float | None]] = []
    for n in counts:
        for pipeline in (False, True):  # side by side: the barrier, then generations overlapped
            row = one(n, args.delay, args.budget, args.jitter, pipeline)
            rows.append(row)
            split = (f" = {row['all_busy_s']:.1f} all busy + {row['barrier_s']:.1f} barrier"
                     f" + {row['engine_s']:.1f} engine" if not pipeline else "")
            print(f"{n} fake GPUs, {'pipelined' if pipeline else 'barrier'}: "
                  f"{row['candidates_per_min']:.1f} candidates/min; wall {row['wall_s']:.1f} s{split}", flush=True)

    def series(pipeline: bool, key: str) -> list[float | None]:
        return [r[key] for r in rows if r["pipeline"] == float(pipeline)]

    for pipeline in (False, True):
        rates = series(pipeline, "candidates_per_min")
        base = float(rates[0] or 0) / counts[0]
        for r, rate in zip([r for r in rows if r["pipeline"] == float(pipeline)], rates, strict=True):
            r["efficiency"] = float(rate or 0) / (float(r["gpus"] or 1) * base)
    metrics = {
        "scaling.kind": "fake GPUs (Ray logical resources) on a CPU machine; sleep-based evaluator",
        "scaling.delay_s": args.delay,
        "scaling.delay_jitter": args.jitter,
        "scaling.gpus": counts,
        "scaling.candidates_per_min": series(False, "candidates_per_min"),
        "scaling.efficiency": series(False, "efficiency"),
        "scaling.barrier_s": series(False, "barrier_s"),
        "scaling.engine_overhead_s": series(False, "engine_s"),
        "scaling.pipelined.candidates_per_min": series(True, "candidates_per_min"),
        "scaling.pipelined.efficiency": series(True, "efficiency"),
        "scaling.pipelined_over_barrier": [
            float(p or 0) / float(b or 1)
            for p, b in zip(series(True, "candidates_per_min"), series(False, "candidates_per_min"), strict=True)
        ],
    }
    for n, b, p in zip(counts, series(False, "efficiency"), series(True, "efficiency"), strict=True):
        print(f"{n}: efficiency {float(b or 0):.2f} with the barrier, {float(p or 0):.2f} pipelined")
    name = "scaling-fake-gpus" + (f"-jitter{args.jitter:g}" if args.jitter else "")
    print(f"wrote {write_result(name, metrics, {'device': 'cpu'}, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
