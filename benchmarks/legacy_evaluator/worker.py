"""Entry point of an isolated evaluation process: ``python -m evokernel.evaluate.worker``.

The process starts, imports torch, then waits for one line on stdin: the path of a
job file. It runs that one job, writes the result file and exits, so a kernel that
corrupts its CUDA context or the interpreter takes nothing else down with it. The
parent keeps one such process started ahead, so the import cost is off the path.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch  # imported before the job arrives: this is the warm-up

from benchmarks.legacy_evaluator.harness import (
    HarnessConfig,
    peak_bandwidth_gbps,
    run_candidate,
    time_reference,
)
from benchmarks.legacy_evaluator.timing import TimingConfig
from evokernel.candidate import Candidate
from evokernel.evaluate.environment import fingerprint
from evokernel.workload import load_workload


def _config(job: dict[str, Any]) -> HarnessConfig:
    return HarnessConfig(
        device=job["device"],
        seed=job["seed"],
        trials=job["trials"],
        timing=TimingConfig(**job["timing"]),
        peak_bandwidth_gbps=job.get("peak_bandwidth_gbps") or peak_bandwidth_gbps(job["device"]),
        scratch=Path(job["scratch"]),
        environment=job.get("environment"),
        build_cache=Path(job["build_cache"]) if job.get("build_cache") else None,
    )


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    workload = load_workload(job["workload"], Path(job["workloads_root"]))
    config = _config(job)
    if job["mode"] == "environment":
        return {"environment": fingerprint(torch.device(job["device"]))}
    if job["mode"] == "reference":
        timings = time_reference(workload, job["shapes"], config)
        return {"reference": {k: v.model_dump(mode="json") for k, v in timings.items()}}
    candidate = Candidate.model_validate(job["candidate"])
    evaluation = run_candidate(workload, candidate, job["shapes"], config)
    return {"evaluation": evaluation.model_dump(mode="json")}


def main() -> int:
    line = sys.stdin.readline().strip()
    if not line:
        return 0  # the parent closed the pipe without a job: a spare that was not needed
    job_path = Path(line)
    job = json.loads(job_path.read_text())
    result_path = Path(job["result"])
    os.chdir(job["scratch"])
    if job["device"] == "cpu":
        torch.set_num_threads(max(1, int(job.get("cpu_threads", 1))))
    try:
        result = run_job(job)
    except Exception:
        result = {"error": traceback.format_exc()}
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a kernel may have left the process in a state where
    # destructors crash, and the result is already safe on disk.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
