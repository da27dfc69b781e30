"""Call a workload's seeds (and variants of them) on chosen shapes, with no judge (GPU, trusted).

    python benchmarks/probe_kernels.py --workload dsa_topk --seed cuda_family \\
        --variant fast:MS_WARPS=16,ML_WARPS=16 --shapes quick [--calls 20] [--ncu] [--check]

Without ``--ncu`` it prints, per subject and shape, the median CUPTI span of one eager
call with L2 flushed (the judge's method, without the judge's isolation) and writes
``probe-kernels-<workload>`` to benchmarks/results/ (or $OUT). With ``--ncu`` it only
makes the calls (``--calls`` per shape, L2 flushed between them), for Nsight Compute
to profile from outside, since ncu and CUPTI's activity API cannot both hold the
device: ``bash benchmarks/gpu_run.sh ncu`` runs it so. With ``--check``, the outputs of
two calls per subject and shape (outputs poisoned before each) go through the workload's
own checker against its expected outputs, and a PASSED or INCORRECT line is printed for
each; the exit status is 1 if any was INCORRECT.

A probe for finding where a kernel's time goes, not a figure for the README: only the
judge's results count as results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import yaml

from evokernel.candidate import Candidate
from evokernel.evaluate.build import arch_for_capability, build_runner
from evokernel.evaluate.check import Verdict, check_outputs
from evokernel.workload import load_workload


def subjects_of(seed: Candidate, specs: list[str]) -> list[tuple[str, Candidate]]:
    """The seed's defaults, then one subject per ``NAME:KNOB=VALUE[,...]``."""
    subjects = [("default", seed)]
    for spec in specs:
        name, _, text = spec.partition(":")
        if not name or "=" not in text:
            raise SystemExit(f"--variant {spec!r}: want NAME:KNOB=VALUE[,KNOB=VALUE...]")
        values = {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in text.split(","))}
        knobs = {k: v for k, v in values.items() if k in seed.knob_space}
        launch = {k: v for k, v in values.items() if k in seed.launch_space}
        unknown = set(values) - set(knobs) - set(launch)
        if unknown:
            raise SystemExit(f"--variant {spec!r}: {seed.name} has no parameter {sorted(unknown)}")
        subjects.append((name, seed.with_params(knobs=knobs, launch=launch, operator="probe")))
    return subjects


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="dsa_topk")
    parser.add_argument("--seed", default="cuda_family")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KNOB=VALUE[,...]")
    parser.add_argument("--shapes", default="quick", help="a subset, or shape ids, comma-separated")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--ncu", action="store_true", help="only call; Nsight Compute measures")
    parser.add_argument("--check", action="store_true",
                        help="check two calls' outputs with the workload's checker (PASSED/INCORRECT)")
    args = parser.parse_args()

    workload = load_workload(args.workload)
    seeds = {s.name: s for s in workload.seeds()}
    if args.seed not in seeds:
        raise SystemExit(f"--seed {args.seed!r}: {args.workload} has {sorted(seeds)}")
    device = torch.device("cuda")
    arch = arch_for_capability(*torch.cuda.get_device_capability())
    shapes = workload.resolve_shapes(args.shapes.split(","))

    from evokernel.evaluate.timing import CuptiSpans, L2Flusher

    flush = L2Flusher(device)
    spans = None if args.ncu else CuptiSpans()
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    incorrect = 0
    for name, subject in subjects_of(seeds[args.seed], args.variant):
        run, _ = build_runner(subject, Path(tempfile.mkdtemp()), arch=arch,
                              arguments=[*workload.input_names, *workload.output_names])
        for shape in shapes:
            inputs = workload.make_inputs(shape, 0, device)
            outputs = workload.allocate_outputs(shape, device)

            def call(run: Any = run, inputs: dict[str, Any] = inputs, outputs: list[Any] = outputs) -> None:
                run(*inputs.values(), *outputs)

            axes = workload.axes_of(shape)
            passed = None
            if args.check:
                try:
                    verdict = check_calls(workload, inputs, outputs, call)
                except Exception as exc:  # a kernel fault leaves the context unusable: stop
                    print(f"{name:12s} {shape[:8]} {axes}: INCORRECT (raised) {exc!r}", flush=True)
                    raise
                passed = verdict.ok
                incorrect += not verdict.ok
                print(f"{name:12s} {shape[:8]} {axes}: "
                      f"{'PASSED' if verdict.ok else 'INCORRECT ' + verdict.message}", flush=True)
                checks.append({"subject": name, "shape": shape, **axes, "passed": verdict.ok,
                               "message": verdict.message})
            call()  # first call: lazy set-up, workspaces
            torch.cuda.synchronize()
            if spans is None:
                for _ in range(args.calls):
                    flush()
                    call()
                torch.cuda.synchronize()
                print(f"{name:12s} {shape[:8]} {axes}: {args.calls} calls made", flush=True)
                continue
            got = [s for s in spans.measure([call] * args.calls, flush) if s]
            median_us = statistics.median(got) * 1e3 if got else None
            rows.append({"subject": name, "shape": shape, **axes, "cupti_us": median_us,
                         "passed": passed, "params": subject.params if name != "default" else {}})
            print(f"{name:12s} {shape[:8]} {axes}: CUPTI span median "
                  f"{median_us if median_us is None else round(median_us, 2)} us", flush=True)
    if rows:
        from benchmarks.record import write_result
        from evokernel.evaluate.environment import fingerprint

        means = {}
        for name in dict.fromkeys(r["subject"] for r in rows):
            values = [r["cupti_us"] for r in rows if r["subject"] == name and r["cupti_us"]]
            means[f"{args.workload}.{args.seed}.{name}.mean_cupti_us"] = (
                statistics.fmean(values) if values else None)
        print(f"wrote {write_result(f'probe-kernels-{args.workload}', means, fingerprint(device), rows)}")
    if args.check:
        print(f"check: {len(checks) - incorrect} PASSED, {incorrect} INCORRECT of {len(checks)}")
        if checks and not rows:
            from benchmarks.record import write_result
            from evokernel.evaluate.environment import fingerprint

            summary = {f"{args.workload}.{args.seed}.check_incorrect": float(incorrect)}
            print(f"wrote {write_result(f'probe-check-{args.workload}', summary, fingerprint(device), checks)}")
    return 1 if incorrect else 0


def check_calls(workload: Any, inputs: dict[str, Any], outputs: list[Any], call: Any) -> Verdict:
    """The checker's verdict on two consecutive calls (the second finds the workspaces a
    first call left), each into outputs poisoned first so that nothing stale passes."""
    expected = workload.expected_outputs(*inputs.values())
    for attempt in range(2):
        for out in outputs:
            out.fill_(float("nan") if out.is_floating_point() else -7)
        call()
        torch.cuda.synchronize()
        verdict = check_outputs(workload, outputs, expected, inputs)
        if not verdict.ok or attempt == 1:
            return verdict
    raise AssertionError("unreachable")


if __name__ == "__main__":
    sys.exit(main())
