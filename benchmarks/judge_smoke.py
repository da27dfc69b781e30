"""A quick look at the judge on this machine: seeds and faulty kernels on a few shapes.

    python benchmarks/judge_smoke.py [--shapes smoke] [--timeout 60]

Prints, per candidate, its status, per shape the judge's latency, CUPTI's span and the
baseline's, and writes them to $OUT/judge-smoke.json. Not a recorded figure: a check
that the judge's GPU path works end to end before the long benchmarks run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evokernel.candidate import load_candidate
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.workload import load_workload

CANDIDATES = Path(__file__).resolve().parent.parent / "tests" / "evaluate" / "candidates"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="smoke")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--extra", default="cuda/illegal_address.yaml,cuda/oob_write.yaml,"
                        "cuda/infinite_loop.yaml,side_stream.py,wrong_answer.py")
    args = parser.parse_args()
    workload = load_workload("dsa_topk")
    shapes = workload.resolve_shapes(args.shapes)
    subjects = [(s.name, s) for s in workload.seeds()]
    subjects += [(name, load_candidate(CANDIDATES / name, "dsa_topk"))
                 for name in args.extra.split(",") if name]
    report = []
    config = SandboxConfig(timeout_s=args.timeout)
    with SandboxEvaluator("dsa_topk", config=config) as ev:
        t0 = time.perf_counter()
        baseline = ev.baseline_timings(shapes)
        print(f"environment: {ev.environment()}", flush=True)
        print(f"baseline timed in {time.perf_counter() - t0:.1f} s", flush=True)
        for name, candidate in subjects:
            t0 = time.perf_counter()
            result = ev.evaluate(candidate, shapes)
            wall = time.perf_counter() - t0
            print(f"== {name}: {result.status.value} in {wall:.1f} s  fitness={result.fitness}",
                  flush=True)
            if result.status.value != "PASSED":
                print("   ", result.feedback[:600].replace("\n", "\n    "), flush=True)
            for s in result.shapes:
                t, r = s.timing, baseline.get(s.shape)
                print(f"   {s.shape[:8]} {s.status.value:10s} "
                      + (f"judge {t.median_ms * 1e3:8.2f} us ({t.method}, n={t.samples}) "
                         f"cupti {t.cupti_ms * 1e3 if t.cupti_ms else float('nan'):8.2f} us "
                         f"e2e {t.e2e_ms * 1e3:8.1f} us {t.cupti_note[:80]}" if t else "")
                      + (f" | ref judge {r.median_ms * 1e3:9.1f} us cupti "
                         f"{(r.cupti_ms or float('nan')) * 1e3:9.1f} us" if r else ""), flush=True)
            report.append({"name": name, "wall_s": wall,
                           "evaluation": result.model_dump(mode="json", exclude={"log"})})
    out = Path(os.environ.get("OUT") or "/tmp")
    (out / "judge-smoke.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
