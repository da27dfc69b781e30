"""The red-team suite on this machine's device: each case's expected and actual status.

    python benchmarks/redteam.py            # CPU here; on a GPU machine, the cuda column

Runs every case of tests/evaluate/candidates/suite.yaml that has an expectation for
this device through one SandboxEvaluator (so a case that kills its worker must not
hurt the next), then a search-free check that the evaluator still passes an honest
candidate. Records ``redteam.cases``, ``redteam.expected_status`` and per case its
expected and actual status.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.candidate import load_candidate
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator, detect_device
from evokernel.evaluate.timing import TimingConfig
from evokernel.workload import load_workload
from tests.evaluate.redteam import CANDIDATES, cases_for


def main() -> int:
    device = detect_device()
    workload = load_workload("dsa_topk")
    shapes = workload.subsets["smoke"][:2]
    config = SandboxConfig(device=device, timeout_s=60, trials=2,
                           timing=TimingConfig(warmup=2, iterations=5, e2e_iterations=1))
    rows = []
    with SandboxEvaluator(workload.name, work_dir=Path(tempfile.mkdtemp()), config=config) as ev:
        for case in cases_for(device):
            result = ev.evaluate(load_candidate(case.path, workload.name), shapes)
            expected = case.expected[device]
            ok = result.status is expected and case.says in result.feedback and result.fitness is None
            rows.append({"case": case.file, "expected": expected.value,
                         "actual": result.status.value, "ok": ok,
                         "feedback": result.feedback.splitlines()[0][:200] if result.feedback else ""})
            print(f"{'ok ' if ok else 'BAD'} {case.file:28s} expected {expected.value:13s} "
                  f"got {result.status.value}", flush=True)
        honest = ev.evaluate(load_candidate(CANDIDATES / "torch_loop.py", workload.name), shapes)
        environment = ev.environment()
    honest_ok = honest.status is Status.PASSED
    print(f"{'ok ' if honest_ok else 'BAD'} honest candidate afterwards: {honest.status.value}")
    metrics = {
        "redteam.device": device,
        "redteam.cases": len(rows),
        "redteam.expected_status": sum(r["ok"] for r in rows),
        "redteam.honest_passes_afterwards": honest_ok,
        **{f"redteam.by_case.{r['case']}": {"expected": r["expected"], "actual": r["actual"]}
           for r in rows},
    }
    print(f"wrote {write_result('redteam', metrics, environment, rows)}")
    return 0 if all(r["ok"] for r in rows) and honest_ok else 1


if __name__ == "__main__":
    sys.exit(main())
