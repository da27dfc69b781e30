"""Evaluator throughput: candidates per minute on a shape subset, and where time goes.

    python benchmarks/evaluator_throughput.py --workload dsa_topk --shapes quick --candidates 12

Candidates are the seeds and variants of them with other declared parameter values
(distinct ids, so nothing is served from a cache). While they run, a thread samples
the GPU's utilisation through NVML (the share of time a kernel was executing); GPU-
busy seconds are the integral of that. Records ``evaluator.<shapes>.candidates_per_min``
and ``evaluator.<shapes>.wall_over_gpu_busy``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.candidate import Candidate
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.workload import load_workload


class UtilisationSampler:
    """Integrates NVML GPU utilisation over time in a background thread."""

    def __init__(self, period_s: float = 0.05) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.period_s = period_s
        self.busy_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(self.period_s)
            now = time.perf_counter()
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            self.busy_s += (now - last) * util / 100.0
            last = now

    def __enter__(self) -> UtilisationSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def variants(seeds: list[Candidate], count: int) -> list[Candidate]:
    """Up to ``count`` distinct candidates: seeds first, then parameter variants."""
    out: dict[str, Candidate] = {s.id: s for s in seeds}
    pools = []
    for seed in seeds:
        space = {**seed.knob_space, **seed.launch_space}
        names = sorted(space)
        pools.append((seed, [dict(zip(names, v, strict=True))
                             for v in itertools.product(*(space[n].choices for n in names))]))
    for i in itertools.count():
        if len(out) >= count or all(i >= len(p) for _, p in pools):
            break
        for seed, combos in pools:
            if i < len(combos) and len(out) < count:
                knobs = {k: v for k, v in combos[i].items() if k in seed.knob_space}
                launch = {k: v for k, v in combos[i].items() if k in seed.launch_space}
                child = seed.with_params(knobs=knobs, launch=launch, operator="benchmark")
                out.setdefault(child.id, child)
    return list(out.values())[:count]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="dsa_topk")
    parser.add_argument("--shapes", default="quick")
    parser.add_argument("--candidates", type=int, default=12)
    args = parser.parse_args()

    workload = load_workload(args.workload)
    shapes = workload.resolve_shapes(args.shapes)
    candidates = variants(workload.seeds(), args.candidates)
    with SandboxEvaluator(workload.name, config=SandboxConfig(timeout_s=300)) as ev:
        ev.reference_timings(shapes)  # measured once per session, not per candidate
        environment = ev.environment()
        rows = []
        with UtilisationSampler() as sampler:
            started = time.perf_counter()
            for candidate in candidates:
                t0 = time.perf_counter()
                result = ev.evaluate(candidate, shapes)
                rows.append({
                    "candidate": candidate.id, "name": candidate.name,
                    "params": str(candidate.params), "status": result.status.value,
                    "fitness": result.fitness, "wall_s": time.perf_counter() - t0,
                    "device_s": result.device_s,
                })
                print(f"{candidate.name:20s} {result.status.value:12s} "
                      f"{rows[-1]['wall_s']:.1f} s fitness={result.fitness}", flush=True)
            wall = time.perf_counter() - started
        busy = sampler.busy_s

    key = f"evaluator.{args.shapes}"
    metrics = {
        f"{key}.candidates": len(candidates),
        f"{key}.candidates_per_min": len(candidates) / wall * 60,
        f"{key}.wall_s": wall,
        f"{key}.gpu_busy_s": busy,
        f"{key}.wall_over_gpu_busy": wall / busy if busy > 0 else None,
        f"{key}.wall_over_harness_device_s": wall / max(sum(r["device_s"] for r in rows), 1e-9),
    }
    for k, v in metrics.items():
        print(f"{k} = {v}")
    print(f"wrote {write_result(f'throughput-{workload.name}', metrics, environment, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
