"""Every seed of a workload on every shape, beside the baseline, in one run.

    python benchmarks/seeds.py --workload dsa_topk --shapes all      # on the GPU machine

Each seed goes through the judge (SandboxEvaluator) with its default parameters; the
baseline (the published reference where a FlashInfer-Trace folder is configured, see
evokernel/evaluate/baseline.py) is timed by the same judge, by the same methods, in the
same run. Per seed and shape it records the judge's latency (batches on fresh inputs,
timed by the judge's clock), CUPTI's kernel span (FlashInfer-Bench's method, kept only
where it agrees with the judge), both speedups, and the floor: least bytes over the
device-to-device copy bandwidth measured here, plus one launch. Metrics, by seed:
``<workload>.<seed>.mean_latency_us`` (judge), ``.mean_latency_us_cupti``,
``.mean_speedup_vs_<baseline>`` (arithmetic, the contest's aggregate),
``.geomean_speedup_vs_<baseline>``, ``.mean_speedup_cupti_vs_<baseline>``,
``.correct_all_shapes``, ``.max_over_floor`` (and ``_cupti``); and ``<workload>.baseline_mean_ms``.
Each subject's CUPTI mean is also given over the shapes of the ``heldout`` subset that
were run (``.heldout.mean_latency_us_cupti``).

``--best PATH`` adds a search's winner as the subject ``best_found`` (its
``best_candidate.json``, a manifest or a ``.py``), and ``<workload>.search_gain_heldout``:
the geometric mean, over the held-out shapes where both passed, of the best seed
default's latency over the best found's (CUPTI span where both have one, else the
judge's), the best seed default being the seed whose defaults have the least mean
latency over those shapes. Run on ``--shapes all`` it is issue 12's closing table:

    python benchmarks/seeds.py --workload dsa_topk --shapes all \
        --variant torch_vectorized:COMPILE=inductor --best runs/x/best_candidate.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import yaml

from benchmarks.record import write_result
from benchmarks.workload_gpu_check import load_best
from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.workload import WorkloadError, load_workload

LAUNCH_US = 2.0
"""One kernel launch as CUPTI sees it on an H200 (docs/flashinfer-bench.md, section 5)."""


def copy_bandwidth_gbps(device: torch.device) -> float | None:
    """Device-to-device copy bandwidth, counting bytes read and written (None on the CPU)."""
    if device.type != "cuda":
        return None
    src = torch.empty(2 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    seconds = start.elapsed_time(end) / 1e3 / 10
    del src, dst
    return 2 * (2 << 30) / seconds / 1e9


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _geomean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


BEST_FOUND = "best_found"


def heldout_gain(rows: list[dict[str, Any]], heldout: set[str], seeds: list[str]) -> dict[str, Any]:
    """``search_gain_heldout`` from the rows: the best seed default (least mean latency over
    the held-out shapes, among ``seeds`` that passed all of them) against ``best_found``,
    shape by shape: CUPTI spans where both rows have one, else the judge's latencies.
    None unless the best found passed every held-out shape."""
    passed = {(r["subject"], r["shape"]): r for r in rows
              if r["shape"] in heldout and r["status"] == "PASSED" and r.get("latency_us")}

    def complete(subject: str) -> bool:
        return bool(heldout) and all((subject, shape) in passed for shape in heldout)

    def mean_latency(subject: str) -> float:
        return statistics.fmean(passed[subject, s].get("cupti_us") or passed[subject, s]["latency_us"]
                                for s in heldout)

    contenders = [name for name in seeds if complete(name)]
    if not contenders or not complete(BEST_FOUND):
        return {"search_gain_heldout": None, "search_gain_heldout_best_seed": None}
    best_seed = min(contenders, key=mean_latency)
    ratios = []
    for shape in sorted(heldout):
        seed_row, found_row = passed[best_seed, shape], passed[BEST_FOUND, shape]
        figure = "cupti_us" if seed_row.get("cupti_us") and found_row.get("cupti_us") else "latency_us"
        ratios.append(seed_row[figure] / found_row[figure])
    return {"search_gain_heldout": _geomean(ratios), "search_gain_heldout_min": min(ratios),
            "search_gain_heldout_shapes": len(ratios), "search_gain_heldout_best_seed": best_seed}


def judge_in_groups(ev: SandboxEvaluator, subjects: list[tuple[str, Candidate]],
                    groups: list[list[str]]) -> dict[str, Evaluation]:
    """Each subject judged on every group of shapes, group after group (the judge's
    inputs for a group are made once for all subjects, not once a subject when all the
    shapes do not fit its memory). A subject that fails a group is not judged on the
    next; its evaluation is the first failure's, with every shape result so far."""
    judged: dict[str, Evaluation] = {}
    for group in groups:
        for label, subject in subjects:
            before = judged.get(label)
            if before is not None and before.status is not Status.PASSED:
                continue
            started = time.perf_counter()
            result = ev.evaluate(subject, group)
            done = len(before.shapes) if before else 0
            print(f"{label:24s} {result.status.value:12s} shapes {done + 1}-{done + len(group)} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
            if result.status is not Status.PASSED:
                print("   ", result.feedback[:2000], flush=True)
            if before is not None:
                result = result.model_copy(update={"shapes": (*before.shapes, *result.shapes)})
            judged[label] = result
    return judged


def variant(seeds: dict[str, Candidate], spec: str) -> tuple[str, Candidate]:
    """``SEED:NAME=VALUE[,...]`` as a subject: the seed with those knobs and launch
    parameters changed, named ``SEED[NAME=VALUE,...]``. ValueError for a spec that names no
    seed, no value, or a parameter the seed does not declare."""
    seed_name, _, text = spec.partition(":")
    if seed_name not in seeds or "=" not in text:
        raise ValueError(f"--variant {spec!r}: want SEED:NAME=VALUE with SEED one of {sorted(seeds)}")
    values = {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in text.split(","))}
    seed = seeds[seed_name]
    unknown = sorted(set(values) - set(seed.space))
    if unknown:
        raise ValueError(f"--variant {spec!r}: {seed_name} declares no parameter {unknown}")
    launch = {k: v for k, v in values.items() if k in seed.launch_space}
    knobs = {k: v for k, v in values.items() if k not in launch}
    return f"{seed_name}[{text}]", seed.with_params(knobs=knobs, launch=launch, operator="variant")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="dsa_topk")
    parser.add_argument("--shapes", default="all")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--only", default=None, help="comma-separated seed names")
    parser.add_argument("--baseline", default="auto", choices=["auto", "published", "own"])
    parser.add_argument("--tag", default="seeds", help="result file name prefix")
    parser.add_argument("--variant", action="append", default=[], metavar="SEED:NAME=VALUE[,...]",
                        help="also a seed with parameters (knobs or launch) changed, named SEED[NAME=VALUE] "
                             "(e.g. torch_vectorized:COMPILE=inductor, the torch.compile column)")
    parser.add_argument("--group", type=int, default=0,
                        help="shapes judged together (0: as many as the judge's memory holds)")
    parser.add_argument("--best", default=None, type=Path,
                        help="a search's winner (best_candidate.json, its run directory or best_solution.json "
                             "there, a manifest or a .py): subject best_found")
    args = parser.parse_args()

    workload = load_workload(args.workload)
    shapes = workload.resolve_shapes(args.shapes)
    heldout = set(workload.resolve_shapes("heldout")) & set(shapes) if "heldout" in workload.subsets else set()
    every = {s.name: s for s in workload.seeds()}
    subjects = [(s.name, s) for s in every.values()
                if not args.only or s.name in args.only.split(",")]
    for spec in args.variant:
        try:
            subjects.append(variant(every, spec))
        except ValueError as exc:
            parser.error(str(exc))
    if args.best is not None:
        try:
            subjects.append((BEST_FOUND, load_best(args.best, workload)))
        except WorkloadError as exc:
            parser.error(str(exc))
    rows: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    name = workload.name
    config = SandboxConfig(timeout_s=args.timeout, baseline=args.baseline)
    with SandboxEvaluator(workload.name, config=config) as ev:
        bandwidth = copy_bandwidth_gbps(ev.device)
        room = args.group or ev.bank_room(shapes[0])
        groups = [shapes[i:i + room] for i in range(0, len(shapes), room)]
        if len(groups) > 1:
            print(f"{len(shapes)} shapes in {len(groups)} groups of at most {room} (the judge's inputs "
                  "for one group fit its memory): every subject is judged group by group", flush=True)
        started = time.perf_counter()
        baseline: dict[str, Any] = {}
        floors: dict[str, float | None] = {}
        for group in groups:  # each group's floors while its inputs are still held
            baseline |= ev.warm_up(group)  # and the inputs and spares: no subject is timed cold
            for shape in group:
                bank = ev.bank(shape)
                cost = workload.cost(bank.inputs_of(bank.variant(0)))
                floors[shape] = (cost["bytes"] / (bandwidth * 1e9) * 1e6 + LAUNCH_US
                                 if cost and bandwidth else None)
        kind = ev.baseline.kind
        print(f"baseline ({kind}, {ev.baseline.origin}) timed on {len(shapes)} shapes in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        for shape in shapes:
            t = baseline[shape]
            rows.append({"subject": f"{kind}_reference", "shape": shape, "status": "PASSED",
                         **workload.shapes[shape].axes, "latency_us": t.median_ms * 1e3,
                         "cupti_us": t.cupti_ms * 1e3 if t.cupti_ms else None,
                         "method": t.method, "floor_us": floors[shape]})
        metrics[f"{name}.baseline"] = f"{kind} ({ev.baseline.origin})"
        metrics[f"{name}.baseline_mean_ms"] = _mean([t.median_ms for t in baseline.values()])
        metrics[f"{name}.baseline_mean_ms_cupti"] = _mean(
            [t.cupti_ms for t in baseline.values() if t.cupti_ms])
        metrics[f"{name}.copy_bandwidth_gbps"] = bandwidth
        judged = judge_in_groups(ev, subjects, groups)
        for label, _ in subjects:
            result = judged[label]
            passed = [s for s in result.shapes if s.timing is not None]
            for s in result.shapes:
                t = s.timing
                rows.append({
                    "subject": label, "shape": s.shape, "status": s.status.value,
                    **workload.shapes[s.shape].axes,
                    "latency_us": t.median_ms * 1e3 if t else None,
                    "fastest_batch_us": t.p25_ms * 1e3 if t else None,
                    "slowest_batch_us": t.p75_ms * 1e3 if t else None,
                    "cupti_us": t.cupti_ms * 1e3 if t and t.cupti_ms else None,
                    "cupti_note": t.cupti_note if t else None,
                    "e2e_us": t.e2e_ms * 1e3 if t else None,
                    "method": t.method if t else None,
                    "reference_us": baseline[s.shape].median_ms * 1e3,
                    "reference_cupti_us": (baseline[s.shape].cupti_ms or math.nan) * 1e3,
                    "speedup": s.speedup, "speedup_cupti": s.speedup_cupti,
                    "floor_us": floors[s.shape],
                    "over_floor": t.median_ms * 1e3 / floors[s.shape]
                    if t and floors[s.shape] else None,
                    "message": s.message[:300],
                    **{f"stat_{k}": v for k, v in s.stats.items()},
                })
            key = f"{name}.{label}"
            speedups = [s.speedup for s in passed if s.speedup]
            cupti = [s.timing.cupti_ms * 1e3 for s in passed if s.timing and s.timing.cupti_ms]
            cupti_speedups = [s.speedup_cupti for s in passed if s.speedup_cupti]
            over = [r["over_floor"] for r in rows if r["subject"] == label and r.get("over_floor")]
            over_cupti = [r["cupti_us"] / r["floor_us"] for r in rows
                          if r["subject"] == label and r.get("cupti_us") and r.get("floor_us")]
            heldout_cupti = [r["cupti_us"] for r in rows if r["subject"] == label
                             and r["shape"] in heldout and r["status"] == "PASSED" and r.get("cupti_us")]
            metrics |= {
                f"{key}.correct_all_shapes": result.status.value == "PASSED" and len(passed) == len(shapes),
                f"{key}.mean_latency_us": _mean([s.timing.median_ms * 1e3 for s in passed if s.timing]),
                f"{key}.mean_latency_us_cupti": _mean(cupti) if len(cupti) == len(passed) else None,
                f"{key}.cupti_shapes": len(cupti),
                f"{key}.mean_speedup_vs_{kind}": _mean(speedups),
                f"{key}.geomean_speedup_vs_{kind}": _geomean(speedups),
                f"{key}.mean_speedup_cupti_vs_{kind}": _mean(cupti_speedups),
                f"{key}.geomean_speedup_cupti_vs_{kind}": _geomean(cupti_speedups),
                f"{key}.max_over_floor": max(over) if over else None,
                f"{key}.max_over_floor_cupti": max(over_cupti) if over_cupti else None,
                f"{key}.heldout.mean_latency_us_cupti": _mean(heldout_cupti) if heldout_cupti else None,
            }
        environment = ev.environment()
    if args.best is not None:
        seed_labels = [label for label, _ in subjects if label in every]
        metrics |= {f"{name}.{k}": v for k, v in heldout_gain(rows, heldout, seed_labels).items()}
    for k, v in metrics.items():
        print(f"{k}: {v}")
    print(f"wrote {write_result(f'{args.tag}-{name}', metrics, environment, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
