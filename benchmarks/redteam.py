"""The red-team suite on this machine's device: each case's expected and actual outcome.

    python benchmarks/redteam.py            # CPU here; on a GPU machine, the cuda column
    python benchmarks/redteam.py --shapes 30cecff1-7ea4-474b-90fc-7f4a87206d8e
    python benchmarks/redteam.py --start-at holds_device_memory.py   # the rest of a cut run

Runs every case of tests/evaluate/candidates/suite.yaml that has an expectation for
this device through one judge (so a case that kills its process must not hurt the
next), judged exactly as the tests judge it (tests/evaluate/redteam.py), with secrets
planted in the judge's environment. Records ``redteam.<device>.cases`` and
``redteam.<device>.as_expected`` (device: ``cpu``, or the GPU's short name, e.g.
``h200``), whether an honest candidate still passes afterwards, and per case its
expected and actual status and what went wrong. ``--start-at`` runs the suite from a named
case on (a run cut short by its time limit goes on there); its record says so
(``redteam.<device>.first_case``), and the two records together cover the suite.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxEvaluator, detect_device
from evokernel.workload import load_workload
from tests.evaluate.redteam import (
    HONEST,
    Case,
    cases_for,
    config_for,
    evaluate,
    judge_case,
    planted_secrets,
)


def device_slug(device: str) -> str:
    """``cpu``, or the GPU's model in lower case (``h200`` for an NVIDIA H200)."""
    if device != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name()
    found = re.search(r"\b([A-Z]+\d+[A-Z]*)\b", name.replace("NVIDIA ", ""))
    return (found.group(1) if found else re.sub(r"\W+", "-", name)).lower()


def cases_from(cases: list[Case], start_at: str) -> list[Case]:
    """The cases from the one named ``start_at`` on (all of them when it is empty)."""
    if not start_at:
        return cases
    names = [case.name for case in cases]
    if start_at not in names:
        raise SystemExit(f"--start-at {start_at!r}: no such case for this device (cases: {', '.join(names)})")
    return cases[names.index(start_at):]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="", help="comma-separated shape ids (default: 2 smoke shapes)")
    parser.add_argument("--start-at", default="", metavar="CASE",
                        help="run from this case of the suite on (e.g. the first one a cut run missed)")
    parser.add_argument("--quiet-graphs", action="store_true",
                        help="judge with SandboxConfig.quiet_graphs (graph replays wait for starting spares)")
    args = parser.parse_args()
    device = detect_device()
    slug = device_slug(device)
    cases = cases_from(cases_for(device), args.start_at)
    workload = load_workload("dsa_topk")
    shapes = args.shapes.split(",") if args.shapes else workload.subsets["smoke"][:2]
    first = {f"redteam.{slug}.first_case": cases[0].name} if args.start_at else {}
    what = "redteam-quiet_graphs" if args.quiet_graphs else "redteam"  # not over the default run's file
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="redteam-"))
    with planted_secrets(), SandboxEvaluator(workload.name, work_dir=work,
                                             config=config_for(device, quiet_graphs=args.quiet_graphs)) as ev:
        alone = evaluate(ev, HONEST, shapes)
        for case in cases:
            t0 = time.perf_counter()
            case_shapes = shapes[:1] if case.file == "eats_memory.py" else shapes
            outcome = judge_case(ev, case, case_shapes, alone.fitness)
            expected = "|".join(s.value for s in case.expected[device])
            rows.append({"case": case.name, "expected": expected, "actual": outcome.status,
                         "ok": outcome.ok, "fitness": outcome.fitness,
                         "seconds": round(time.perf_counter() - t0, 2),
                         "problems": "; ".join(outcome.problems)[:1000],
                         "feedback": outcome.feedback.splitlines()[0][:200] if outcome.feedback else ""})
            print(f"{'ok ' if outcome.ok else 'BAD'} {case.name:42s} expected {expected:17s} "
                  f"got {outcome.status}", flush=True)
            for problem in outcome.problems:
                print(f"      {problem[:400]}", flush=True)
            # after every case, so that a run cut short keeps what it judged
            write_result(what, {f"redteam.{slug}.cases": len(rows),
                                     f"redteam.{slug}.as_expected": sum(r["ok"] for r in rows),
                                     f"redteam.{slug}.complete": False, **first}, ev.environment(), rows)
        honest = evaluate(ev, HONEST, shapes)
        environment = ev.environment()
    honest_ok = alone.status is Status.PASSED and honest.status is Status.PASSED
    seconds = time.perf_counter() - started
    as_expected = sum(r["ok"] for r in rows)
    print(f"{'ok ' if honest_ok else 'BAD'} honest candidate before and after: "
          f"{alone.status.value} ({alone.fitness}), {honest.status.value} ({honest.fitness})")
    print(f"{as_expected}/{len(rows)} cases as expected in {seconds:.0f} s")
    metrics = {
        f"redteam.{slug}.cases": len(rows),
        f"redteam.{slug}.as_expected": as_expected,
        f"redteam.{slug}.honest_passes_afterwards": honest_ok,
        f"redteam.{slug}.complete": True,
        f"redteam.{slug}.seconds": round(seconds, 1),
        f"redteam.{slug}.quiet_graphs": args.quiet_graphs,
        **first,
    }
    print(f"wrote {write_result(what, metrics, environment, rows)}")
    return 0 if as_expected == len(rows) and honest_ok else 1


if __name__ == "__main__":
    sys.exit(main())
