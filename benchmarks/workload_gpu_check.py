"""Every seed of a workload on every shape, checked and timed beside the published reference.

    python benchmarks/workload_gpu_check.py --workload fused_moe --shapes all

In one process on the GPU (trusted code only: the seeds, not search candidates):

- the published reference (the ``reference`` of the definition in the FlashInfer-Trace
  dataset: ``--trace-root``, else $EVOKERNEL_TRACE_ROOT, else a ``shared/flashinfer-trace``
  in or beside the checkout) and our reference.py are run on ``--trials`` input sets per
  shape and compared with the workload's checker: the reference agrees, or it does not;
- each seed is built and run on the same sets and on ``--variants`` inputs from
  ``vary_inputs`` (outputs poisoned with NaN before each call), and checked;
- the published reference, our reference and each correct seed are timed with the
  evaluator's own timing (L2 flush before each call; CUDA graphs where a callable can
  be captured, else host-timed between syncs), and the memory floor of each shape is
  printed: the workload's least bytes (``cost``) over the device bandwidth measured
  here by a large copy. Where the workload also counts its flops and the device has FP8
  tensor cores, the roofline floor is printed beside it: the larger of that memory floor
  and the flops over the dense FP8 GEMM rate measured here (``torch._scaled_mm``, 8192
  cubed). Past a few hundred tokens fused_moe is compute-bound, and no kernel comes
  within 1.5x of its memory floor there. (For a workload computing in bf16 the FP8 rate
  makes the roofline a looser lower bound: still a floor, not a tight one.)

``--compile`` adds a ``torch_compile`` column: the workload's torch seed with its knob
``COMPILE: inductor`` (torch.compile of the same function, ``dynamic=False``; where the
seed's declared constraints rule out a knob value under compilation, the constraint
repair picks the nearest valid one, e.g. dense dispatch for fused_moe). It is built
afresh for every shape after a reset of torch's compiler caches (one compilation per
shape: with one compiled function across shapes, torch falls back to eager after its
recompilation limit), then checked and timed like a seed.

The workload's baselines (``Workload.baselines()``: candidates users run today, never
a search's seeds; fused_moe's ``triton_baseline``) are columns of their own, built,
checked and timed like the seeds (metrics ``<workload>.<baseline>``); ``--best PATH``
adds a ``best_found`` column, a candidate found by a search (a manifest, a ``.py``, or
the candidate JSON a search writes). Every other column's row gets ``over_<baseline>``,
the baseline's latency over its own on that shape (how many times faster than the
baseline it is), and its metrics the geometric mean over the shapes where both passed
(``<key>.over_<baseline>``) and the least (``<key>.over_<baseline>_min``); likewise
``<workload>.best_seed.over_<baseline>`` for the fastest seed of each shape. Each
shape's line shows its memory floor.

On a GPU every correct callable is also run once under ``torch.cuda.set_sync_debug_mode
("error")``; the row's ``host_sync`` is empty when no call synchronised with the host,
else what torch said (such a callable cannot be captured in a CUDA graph).

Records ``<workload>.reference_matches_published``, ``<workload>.published_reference_mean_ms``,
``<workload>.measured_bandwidth_gbps`` and per seed (``<workload>.seeds.<seed>``) and for
torch.compile (``<workload>.torch_compile``) ``correct_all_shapes``,
``mean_speedup_vs_published`` (arithmetic), ``geomean_speedup_vs_published`` and
``max_over_floor``, ``max_over_roofline`` (and ``over_<baseline>`` as said above), with
``<workload>.measured_fp8_tflops``; per callable and shape the
raw numbers are in the CSV beside the JSON.
``--device cpu --iterations 2 --shapes smoke`` is a dry run of the script on a CPU
(Triton and CUDA seeds are then reported as not run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.legacy_evaluator.timing import TimingConfig, time_cpu, time_gpu
from benchmarks.record import write_result
from evokernel.candidate import Candidate, Language
from evokernel.evaluate.build import BuildError, arch_for_capability, build_runner
from evokernel.evaluate.check import check_outputs
from evokernel.evaluate.environment import fingerprint
from evokernel.workload import Workload, WorkloadError, load_workload

REPO = Path(__file__).resolve().parent.parent


def trace_roots(explicit: str | None) -> list[Path]:
    """Where to look for the FlashInfer-Trace dataset, in order."""
    found = [Path(explicit)] if explicit else []
    if os.environ.get("EVOKERNEL_TRACE_ROOT"):
        found.append(Path(os.environ["EVOKERNEL_TRACE_ROOT"]))
    found += [REPO / "shared" / "flashinfer-trace", REPO.parent / "shared" / "flashinfer-trace",
              REPO.parent.parent / "shared" / "flashinfer-trace"]
    return found


def load_published(name: str, roots: Sequence[Path]) -> tuple[Callable[..., Any] | None, str]:
    """The published reference ``run`` of definition ``name``, and where it came from."""
    import json

    for root in roots:
        for path in sorted(root.glob(f"definitions/**/{name}.json")):
            source = json.loads(path.read_text()).get("reference")
            if source:
                namespace: dict[str, Any] = {}
                exec(compile(source, str(path), "exec"), namespace)
                return namespace["run"], str(path)
    return None, "not found in " + ", ".join(str(r) for r in roots)


def measure_bandwidth_gbps(device: torch.device) -> float | None:
    """Device memory bandwidth from a 2 GiB copy (read + write), median of 20."""
    if device.type != "cuda":
        return None
    import triton.testing

    src = torch.empty(1 << 31, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=50, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def measure_fp8_tflops(device: torch.device, size: int = 8192) -> float | None:
    """Dense FP8 (e4m3) GEMM rate of the device, TFLOP/s: ``torch._scaled_mm`` of two
    ``size``-square matrices to bf16 with fast accumulation, median of the timed runs.
    None where there are no FP8 tensor cores (before sm_89) or no GPU."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return None
    import triton.testing

    try:  # an optional column: a torch without this private op costs it, not the run
        a = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(size, size, device=device).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=device)
        ms = triton.testing.do_bench(
            lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True),
            warmup=10, rep=100, return_mode="median")
    except (RuntimeError, TypeError, AttributeError) as exc:
        print(f"no FP8 GEMM rate ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}): "
              "no roofline floor", flush=True)
        return None
    return 2 * size**3 / (ms * 1e-3) / 1e12


def floors_us(cost: dict[str, float], bandwidth_gbps: float | None,
              tflops: float | None) -> tuple[float | None, float | None]:
    """(memory floor, roofline floor) of a shape in microseconds: its least bytes over the
    bandwidth, and the larger of that and its flops over the FP8 GEMM rate; None where a
    figure is missing."""
    memory = cost["bytes"] / (bandwidth_gbps * 1e9) * 1e6 if bandwidth_gbps and "bytes" in cost else None
    if memory is None or not tflops or "flops" not in cost:
        return memory, None
    return memory, max(memory, cost["flops"] / (tflops * 1e12) * 1e6)


def build_seed(seed: Candidate, wl: Workload, device: torch.device, scratch: Path) -> tuple[Any, str]:
    """(DPS callable or None, why not)."""
    if device.type == "cpu" and seed.language is not Language.TORCH:
        return None, f"{seed.language.value} seed not run on the CPU"
    arch = arch_for_capability(*torch.cuda.get_device_capability(device)) if device.type == "cuda" else None
    try:
        fn, _ = build_runner(seed, scratch / seed.name, arch=arch,
                             arguments=[*wl.input_names, *wl.output_names])
    except BuildError as exc:
        return None, f"BUILD_FAILED: {exc}"
    return fn, ""


def dps(run: Callable[..., Any], n_inputs: int) -> Callable[..., None]:
    """A value-returning ``run(*inputs)`` as a destination-passing callable."""
    def call(*args: Any) -> None:
        produced = run(*args[:n_inputs])
        # one output comes back bare: iterating a tensor would walk its rows
        values = produced if isinstance(produced, tuple | list) else (produced,)
        for out, value in zip(args[n_inputs:], values, strict=True):
            out.copy_(value)
    return call


def as_tuple(value: Any) -> tuple[torch.Tensor, ...]:
    return tuple(value) if isinstance(value, tuple | list) else (value,)


class ShapeCase:
    """One shape's input sets and variants, with our reference's outputs for each."""

    def __init__(self, wl: Workload, shape: str, device: torch.device, trials: int, variants: int) -> None:
        self.wl, self.shape, self.device = wl, shape, device
        axes = wl.axes_of(shape)
        self.sets = [wl.make_inputs(shape, 1000 + t, device) for t in range(trials)]
        vary = getattr(wl._inputs_module, "vary_inputs", None)
        self.variants = [] if vary is None else [
            {**self.sets[0], **vary(self.sets[0], axes, 2000 + v, device)} for v in range(variants)
        ]
        self.expected = [as_tuple(wl.reference(*s.values())) for s in self.all_inputs]

    @property
    def all_inputs(self) -> list[dict[str, torch.Tensor]]:
        return [*self.sets, *self.variants]

    def outputs(self) -> list[torch.Tensor]:
        return [out.fill_(float("nan")) if out.is_floating_point() else out.fill_(-1)
                for out in self.wl.allocate_outputs(self.shape, self.device)]

    def check(self, fn: Callable[..., None]) -> str:
        """'' if ``fn`` is correct on every set and variant, else the first problem."""
        for i, (inputs, expected) in enumerate(zip(self.all_inputs, self.expected, strict=True)):
            outs = self.outputs()
            fn(*inputs.values(), *outs)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            verdict = check_outputs(self.wl, outs, expected, inputs)
            if not verdict.ok:
                kind = "set" if i < len(self.sets) else "variant"
                return f"{kind} {i}: {verdict.message}"
        return ""

    def time(self, fn: Callable[..., None], iterations: int, graphs: bool) -> Any:
        calls = [(list(s.values()), self.outputs()) for s in self.sets]
        config = TimingConfig(warmup=3, iterations=iterations, e2e_iterations=3, use_graphs=graphs)
        timer = time_gpu if self.device.type == "cuda" else time_cpu
        timing, _ = timer(fn, calls, config)
        return timing


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


COMPILE_COLUMN = "torch_compile"


def compile_variant(wl: Workload) -> Candidate:
    """The workload's torch seed with ``COMPILE: inductor`` (other knobs repaired to the
    nearest combination its declared constraints allow). Raises WorkloadError without one."""
    for seed in wl.seeds():
        space = seed.knob_space.get("COMPILE")
        if seed.language is Language.TORCH and space is not None and "inductor" in space.choices:
            return seed.with_params(knobs={"COMPILE": "inductor"}, operator="compile")
    raise WorkloadError(f"--compile: workload {wl.name} has no torch seed with a COMPILE: inductor knob")


BEST_COLUMN = "best_found"


def load_best(path: Path, wl: Workload) -> Candidate:
    """A found candidate: the JSON a search writes (sources inline), a manifest naming its
    files, a ``.py`` (``load_candidate`` reads them all), or a run directory (also named
    by its ``best_solution.json``): the best its finalists confirmed, else its best record."""
    from evokernel.candidate import CandidateFileError, load_candidate
    from evokernel.journal import RunDirError

    run_root = path if path.is_dir() else path.parent if path.name == "best_solution.json" else None
    try:
        if run_root is not None:
            return best_of_run(run_root, wl)
        return load_candidate(path, wl.name)
    except (CandidateFileError, RunDirError) as exc:
        raise WorkloadError(f"--best: {exc}") from exc


def best_of_run(root: Path, wl: Workload) -> Candidate:
    """The candidate a finished run names best, by the rule its ``best_solution.json``
    follows (``export.best_record``): the finalists' pick (``finalists.json``), or in a run
    that measured no finalists its best passing record. Finalists that confirmed none name
    none: an error, not the luckiest raw figure they were there to reject."""
    from evokernel.analysis.export import best_record
    from evokernel.journal import RunDir, RunDirError

    run = RunDir.open(root)
    finalists = root / "finalists.json"
    try:
        named = json.loads(finalists.read_text()).get("best") if finalists.is_file() else None
    except (OSError, ValueError, AttributeError) as exc:
        raise RunDirError(f"{finalists} is unreadable: {exc}") from None
    best = best_record(run.records(), named, finalists.is_file())
    if best is None:
        raise RunDirError(f"{root}: its finalists confirmed no candidate (finalists.json names none)"
                          if finalists.is_file() else f"{root}: no candidate passed in this run")
    candidate = run.load_candidate(best.candidate_id)
    if candidate.workload != wl.name:
        raise RunDirError(f"{root} is a run of {candidate.workload}, not {wl.name}")
    return candidate


def add_over_baselines(rows: Sequence[dict[str, Any]], shape: str, baselines: Sequence[str]) -> None:
    """On ``shape``'s passed seed and column rows (those with a speedup; not the references'):
    ``over_<b>`` = baseline b's latency / the row's, for each baseline b that passed there
    (a baseline's own row gets none for itself)."""
    mine = [r for r in rows if r["shape"] == shape and r["status"] == "PASSED" and "speedup" in r]
    for name in baselines:
        base = [r for r in mine if r["callable"] == name]
        if not base:
            continue
        for row in mine:
            if row["callable"] != name:
                row[f"over_{name}"] = base[0]["latency_us"] / row["latency_us"]


def metrics_of(wl: Workload, shapes: Sequence[str], subjects: Sequence[tuple[str, str]],
               rows: Sequence[dict[str, Any]], published: bool, agree: bool,
               bandwidth: float | None, baselines: Sequence[str] = (),
               tflops: float | None = None) -> dict[str, Any]:
    """Flat metrics over the rows so far. ``subjects``: (callable name in the rows, metric
    prefix) of each seed and column; ``shapes_done`` says how far the run got."""
    done = list(dict.fromkeys(r["shape"] for r in rows))
    name = wl.name
    versus = "published" if published else "ours"
    metrics: dict[str, Any] = {
        f"{name}.shapes": len(shapes),
        f"{name}.shapes_done": len(done),
        f"{name}.baseline": "published_reference" if published else "our_reference",
        f"{name}.reference_matches_published": agree if published else None,
        f"{name}.measured_bandwidth_gbps": bandwidth,
        f"{name}.measured_fp8_tflops": tflops,
    }
    baseline_rows = [r for r in rows if r["callable"] == ("published_reference" if published else "our_reference")]
    metrics[f"{name}.published_reference_mean_ms" if published else f"{name}.our_reference_mean_ms"] = (
        sum(r["latency_us"] for r in baseline_rows) / len(baseline_rows) / 1e3
    )
    for subject, key in subjects:
        mine = [r for r in rows if r["callable"] == subject]
        passed = [r for r in mine if r["status"] == "PASSED"]
        metrics[f"{key}.correct_all_shapes"] = len(passed) == len(mine) == len(shapes)
        speedups = [r["speedup"] for r in passed]
        metrics[f"{key}.mean_speedup_vs_{versus}"] = sum(speedups) / len(speedups) if speedups else None
        metrics[f"{key}.geomean_speedup_vs_{versus}"] = geomean(speedups)
        floors = [r["over_floor"] for r in passed if r.get("over_floor")]
        metrics[f"{key}.max_over_floor"] = max(floors) if floors else None
        roofs = [r["over_roofline"] for r in passed if r.get("over_roofline")]
        metrics[f"{key}.max_over_roofline"] = max(roofs) if roofs else None
        for baseline in baselines:
            if baseline == subject:
                continue
            ratios = [r[f"over_{baseline}"] for r in passed if r.get(f"over_{baseline}")]
            metrics[f"{key}.over_{baseline}"] = geomean(ratios)
            metrics[f"{key}.over_{baseline}_min"] = min(ratios) if ratios else None
            metrics[f"{key}.over_{baseline}_shapes"] = len(ratios)
    # The best seed of each shape (the fastest that passed there) against each baseline.
    seed_names = {subject for subject, key in subjects if key.startswith(f"{name}.seeds.")}
    for baseline in baselines:
        ratios = []
        for shape in done:
            mine = [r.get(f"over_{baseline}") for r in rows if r["shape"] == shape and r["callable"] in seed_names]
            if any(mine):
                ratios.append(max(v for v in mine if v))
        metrics[f"{name}.best_seed.over_{baseline}"] = geomean(ratios)
        metrics[f"{name}.best_seed.over_{baseline}_min"] = min(ratios) if ratios else None
        metrics[f"{name}.best_seed.over_{baseline}_shapes"] = len(ratios)
    return metrics


def host_sync(fn: Callable[..., None], case: ShapeCase) -> str:
    """'' if one call of ``fn`` makes no synchronising CUDA call, else torch's message
    (CUDA only: torch.cuda.set_sync_debug_mode)."""
    if case.device.type != "cuda":
        return ""
    inputs, outputs = list(case.sets[0].values()), case.outputs()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*inputs, *outputs)
        return ""
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()


def subject_row(case: ShapeCase, name: str, fn: Callable[..., None] | None, why: str, base: dict[str, Any],
                iterations: int, baseline_ms: float, floor_us: float | None,
                roofline_us: float | None = None) -> dict[str, Any]:
    """One seed's (or column's) row for one shape: checked on every set and variant, then
    timed (CUDA graphs where it can be captured)."""
    row: dict[str, Any] = {**base, "callable": name, "status": "NOT_RUN", "message": why}
    if fn is None:
        return row
    try:
        problem = case.check(fn)
    except Exception as exc:  # a seed that crashes is a row, not the end of the run
        problem = f"RUNTIME_ERROR: {type(exc).__name__}: {exc}"
    if problem:
        row.update(status="INCORRECT", message=problem[:500])
        return row
    timing = case.time(fn, iterations, graphs=True)
    row.update(status="PASSED", latency_us=timing.median_ms * 1e3, method=timing.method,
               speedup=baseline_ms / timing.median_ms, host_sync=host_sync(fn, case),
               over_floor=timing.median_ms * 1e3 / floor_us if floor_us else None,
               over_roofline=timing.median_ms * 1e3 / roofline_us if roofline_us else None)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="fused_moe")
    parser.add_argument("--shapes", default="all", help="a subset name or comma-separated ids")
    parser.add_argument("--only", default=None, help="comma-separated seed names")
    parser.add_argument("--trials", type=int, default=3, help="input sets per shape")
    parser.add_argument("--variants", type=int, default=4, help="vary_inputs variants per shape")
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per seed and shape")
    parser.add_argument("--reference-iterations", type=int, default=10)
    parser.add_argument("--trace-root", default=None, help="FlashInfer-Trace dataset folder")
    parser.add_argument("--skip-published", action="store_true",
                        help="do not run the published reference (it needs ~18 GB for fused_moe)")
    parser.add_argument("--compile", action="store_true",
                        help="add a torch_compile column: the torch seed with COMPILE: inductor, compiled per shape")
    parser.add_argument("--best", default=None, type=Path,
                        help="a found candidate (manifest, .py, a search's candidate JSON, or its run directory "
                             "or best_solution.json there): column best_found")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    try:
        wl = load_workload(args.workload)
        shapes = wl.resolve_shapes(args.shapes)
        compiled = compile_variant(wl) if args.compile else None
        baselines = wl.baselines()
        best = load_best(args.best, wl) if args.best else None
    except WorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seeds = [s for s in wl.seeds() if not args.only or s.name in args.only.split(",")]
    subjects = [(s.name, f"{wl.name}.seeds.{s.name}") for s in seeds]
    subjects += [(b.name, f"{wl.name}.{b.name}") for b in baselines]
    baseline_names = [b.name for b in baselines]
    if compiled is not None:
        subjects.append((COMPILE_COLUMN, f"{wl.name}.{COMPILE_COLUMN}"))
        knobs = ", ".join(f"{k}={v}" for k, v in compiled.params.items())
        print(f"{COMPILE_COLUMN}: {compiled.name} with {knobs}", flush=True)
    if best is not None:
        subjects.append((BEST_COLUMN, f"{wl.name}.{BEST_COLUMN}"))
        print(f"{BEST_COLUMN}: {best.name} ({best.id}) from {args.best}", flush=True)
    device = torch.device(args.device)
    published, origin = (None, "skipped") if args.skip_published else load_published(
        wl.definition.name, trace_roots(args.trace_root)
    )
    print(f"published reference: {origin}", flush=True)
    bandwidth = measure_bandwidth_gbps(device)
    if bandwidth:
        print(f"measured bandwidth: {bandwidth:.0f} GB/s", flush=True)
    tflops = measure_fp8_tflops(device)
    if tflops:
        print(f"measured dense FP8 GEMM rate: {tflops:.0f} TFLOP/s", flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="workload_gpu_check-"))
    built = {s.name: build_seed(s, wl, device, scratch) for s in [*seeds, *baselines]}
    if best is not None:
        built[BEST_COLUMN] = build_seed(best, wl, device, scratch)
    n_inputs = len(wl.input_names)
    rows: list[dict[str, Any]] = []
    agree = published is not None
    for shape in shapes:
        started = time.perf_counter()
        case = ShapeCase(wl, shape, device, args.trials, args.variants)
        axes = wl.shape(shape).axes
        cost = wl.cost(case.sets[0]) or {}
        floor_us, roofline_us = floors_us(cost, bandwidth, tflops)
        base: dict[str, Any] = {"shape": shape, **axes, "floor_us": floor_us, "roofline_us": roofline_us,
                                **{f"cost_{k}": v for k, v in cost.items()}}

        published_ms = None
        if published is not None:
            theirs = dps(published, n_inputs)
            problem = case.check(theirs)
            agree &= not problem
            published_ms = case.time(theirs, args.reference_iterations, graphs=False).median_ms
            rows.append({**base, "callable": "published_reference", "status": "AGREES" if not problem else "DIFFERS",
                         "message": problem, "latency_us": published_ms * 1e3})
        ours_ms = case.time(dps(wl.reference, n_inputs), args.reference_iterations, graphs=False).median_ms
        rows.append({**base, "callable": "our_reference", "status": "PASSED", "latency_us": ours_ms * 1e3})
        baseline_ms = published_ms if published_ms is not None else ours_ms

        floor = f"{floor_us:7.1f} us" if floor_us else "?"
        if roofline_us and floor_us and roofline_us > floor_us:
            floor += f" (roofline {roofline_us:.1f} us)"
        line = [f"{axes!s:>20s} floor {floor} ref {baseline_ms:9.3f} ms"]
        for name, _ in subjects:
            if name == COMPILE_COLUMN:
                assert compiled is not None
                torch.compiler.reset()  # one compilation per shape, not eager past the recompile limit
                fn, why = build_seed(compiled, wl, device, scratch)
            else:
                fn, why = built[name]
            row = subject_row(case, name, fn, why, base, args.iterations, baseline_ms, floor_us, roofline_us)
            rows.append(row)
        add_over_baselines(rows, shape, baseline_names)
        for row in rows[len(rows) - len(subjects):]:
            if row["status"] == "PASSED":
                shown = f"{row['latency_us']:9.1f} us {row['speedup']:7.1f}x"
                shown += "".join(f" {row[f'over_{b}']:.2f}x/{b}" for b in baseline_names if f"over_{b}" in row)
                shown += f" (host sync: {row['host_sync']})" if row["host_sync"] else ""
            else:
                shown = str(row["status"])
            line.append(f"{row['callable']} {shown}")
        print(" | ".join(line) + f"  ({time.perf_counter() - started:.0f} s)", flush=True)
        for row in rows:
            if row["shape"] == shape and row["status"] in ("INCORRECT", "DIFFERS"):
                print(f"    {row['callable']}: {row['message'][:300]}", flush=True)
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
        metrics = metrics_of(wl, shapes, subjects, rows, published is not None, agree, bandwidth, baseline_names,
                             tflops)
        path = write_result(f"workload-check-{wl.name}", metrics, fingerprint(device), rows)
    print(f"wrote {path}")

    # without the published reference there is nothing to agree with
    all_ok = (published is None or agree) and all(r["status"] in ("PASSED", "AGREES", "NOT_RUN") for r in rows)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
