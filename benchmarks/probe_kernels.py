"""Call a workload's seeds (and variants of them) on chosen shapes, with no judge (GPU, trusted).

    python benchmarks/probe_kernels.py --workload dsa_topk --seed cuda_family \\
        --variant fast:MS_WARPS=16,ML_WARPS=16 --shapes quick [--calls 20] [--ncu]

Without ``--ncu`` it prints, per subject and shape, the median CUPTI span of one eager
call with L2 flushed (the judge's method, without the judge's isolation) and writes
``probe-kernels-<workload>`` to benchmarks/results/ (or $OUT). With ``--ncu`` it only
makes the calls (``--calls`` per shape, L2 flushed between them), for Nsight Compute
to profile from outside, since ncu and CUPTI's activity API cannot both hold the
device: ``bash benchmarks/gpu_run.sh ncu`` runs it so.

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
    for name, subject in subjects_of(seeds[args.seed], args.variant):
        run, _ = build_runner(subject, Path(tempfile.mkdtemp()), arch=arch,
                              arguments=[*workload.input_names, *workload.output_names])
        for shape in shapes:
            inputs = workload.make_inputs(shape, 0, device)
            outputs = workload.allocate_outputs(shape, device)

            def call(run: Any = run, inputs: dict[str, Any] = inputs, outputs: list[Any] = outputs) -> None:
                run(*inputs.values(), *outputs)

            call()  # first call: lazy set-up, workspaces
            torch.cuda.synchronize()
            axes = workload.axes_of(shape)
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
                         "params": subject.params if name != "default" else {}})
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
