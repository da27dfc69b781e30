"""A recorded landscape of any workload's seeds: points measured through the judge until a
wall-clock budget ends, for replayed strategy comparisons.

    python benchmarks/landscape_gpu.py --workload dsa_sparse_attention \
        --seeds triton_split,cuda_mma --shapes quick --budget 280
    python benchmarks/landscape_gpu.py --workload fused_moe --seeds triton_fused,torch_experts \
        --shapes quick --budget 280 --skip landscape-fused_moe-triton_fused+torch_experts.jsonl \
        --sample-seed 2
    python benchmarks/landscape_gpu.py --workload dsa_topk --seeds torch_vectorized \
        --shapes smoke --budget 60        # a dry run on a CPU (GPU seeds come back SKIPPED)

Points, in order (benchmarks/landscape_points.py): every named seed's defaults, then
each one-parameter-away neighbour, then uniform valid draws over knobs and launch
parameters, the seeds taking turns; no point twice, and none that a ``--skip``
landscape holds (those must be on the same shapes), so each session with another
``--sample-seed`` adds new points. A seed is a name from the workload's seeds folder
or the path of a candidate manifest.

Each point is judged by SandboxEvaluator (what the other GPU scripts use: a fresh
confined process, checked calls on fresh inputs, timing, the baseline timed once per
run; the published reference where $EVOKERNEL_TRACE_ROOT names a FlashInfer-Trace
folder), with ``--timeout`` seconds per evaluation. Failures are recorded like passes.
The run stops before ``--budget`` seconds of wall time (benchmarks/landscape_record.py
says how), or on SIGTERM, with everything written.

Writes into $OUT (else benchmarks/results/): ``landscape-<workload>-<seed>+<seed>.jsonl``
(one line per point, written as it goes, never overwriting an earlier file), and, via
benchmarks/record.py, ``landscape-<workload>-<seeds>-<device>-<date>.json`` (counts by
status, each seed's defaults and best point with the judge's and CUPTI's mean latency)
with a CSV of one row per point and shape, rewritten every few points. Prints one line
per point: running count, elapsed seconds, label, status, latencies. Exit status 0, or
2 on bad input (unknown workload, seed or shapes, unreadable --skip file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# The judge's candidate processes import the same evokernel as this script.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).resolve().parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])])

from benchmarks.landscape_points import LandscapeFileError, Point, landscape_points, measured_ids
from benchmarks.landscape_record import (
    Budget,
    LandscapeFile,
    Measured,
    PointRun,
    evaluation_rows,
    free_path,
    latency_figures,
)
from benchmarks.record import write_result
from evokernel.candidate import Candidate, CandidateFileError, load_candidate
from evokernel.evaluate.result import Status
from evokernel.workload import Workload, WorkloadError, load_workload

REPO = Path(__file__).resolve().parent.parent
SAMPLE_SEED = 2026
SUMMARY_EVERY = 10
"""Points between two rewrites of the summary JSON and CSV (the landscape is written per point)."""


class UsageError(Exception):
    """Bad input: one line on stderr and exit status 2."""


class Terminated(BaseException):
    """SIGTERM arrived: stop measuring, write what was measured. A BaseException, so
    that no ``except Exception`` in the judge turns it into a candidate's failure."""


def resolve_seeds(workload: Workload, names: str) -> list[Candidate]:
    """Comma-separated seed names (or manifest paths) to candidates; UsageError if unknown."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        raise UsageError("--seeds names no seed")
    if len(set(wanted)) != len(wanted):
        raise UsageError(f"--seeds names a seed twice: {names}")
    known = {s.name: s for s in workload.seeds()}
    out = []
    for name in wanted:
        if name in known:
            out.append(known[name])
        elif Path(name).is_file():
            try:
                out.append(load_candidate(name, workload.name))
            except CandidateFileError as exc:
                raise UsageError(str(exc)) from exc
        else:
            raise UsageError(f"workload {workload.name} has no seed {name!r} "
                             f"(seeds: {', '.join(sorted(known))}; or give a manifest's path)")
    return out


def changed_params(candidate: Candidate, seeds: dict[str, Candidate]) -> dict[str, Any]:
    """The parameters of ``candidate`` that differ from its seed's defaults."""
    seed = seeds.get(candidate.name)
    return {k: v for k, v in candidate.params.items() if seed is not None and v != seed.params.get(k)}


class Tally:
    """What the run has measured so far: CSV rows and each point's figures, by seed."""

    def __init__(self, workload: Workload, shapes: Sequence[str], seeds: Sequence[Candidate]) -> None:
        self.workload = workload
        self.shapes = list(shapes)
        self.seeds = {s.name: s for s in seeds}
        self.rows: list[dict[str, Any]] = []
        self.figures: list[tuple[Point, dict[str, Any]]] = []
        self.triton_kernels: dict[str, int] = {}
        """The judge's Triton store at the end: entries admitted, and offered by processes."""

    def add(self, m: Measured) -> dict[str, Any]:
        """Record one verdict; returns its figures (latency_figures)."""
        figures = latency_figures(m.evaluation)
        self.figures.append((m.point, figures))
        fields = {"index": m.index, "seed": m.point.seed, "kind": m.point.kind, "label": m.point.label,
                  "candidate": m.point.candidate.id,
                  "changed": json.dumps(changed_params(m.point.candidate, self.seeds)),
                  "wall_s": m.wall_s, "elapsed_s": m.elapsed_s}
        axes = {s: self.workload.shapes[s].axes for s in self.shapes}
        self.rows += evaluation_rows(fields, m.evaluation, axes)
        return figures

    def metrics(self, prefix: str) -> dict[str, Any]:
        """Counts by status (all and per seed), each seed's defaults and best point."""
        out: dict[str, Any] = {f"{prefix}.points": len(self.figures)}
        for status in Status:
            out[f"{prefix}.count_{status.value.lower()}"] = sum(
                f["status"] == status.value for _, f in self.figures)
        for name in self.seeds:
            mine = [(p, f) for p, f in self.figures if p.seed == name]
            key = f"{prefix}.{name}"
            out[f"{key}.points"] = len(mine)
            for status in Status:
                out[f"{key}.count_{status.value.lower()}"] = sum(f["status"] == status.value for _, f in mine)
            default = next((f for p, f in mine if p.kind == "default"), None)
            if default is not None:
                for figure in ("status", "mean_latency_us", "mean_latency_us_cupti", "mean_speedup"):
                    out[f"{key}.default.{figure}"] = default[figure]
            passed = [(p, f) for p, f in mine if f["status"] == Status.PASSED.value]
            if passed:
                point, best = min(passed, key=lambda pf: pf[1]["mean_latency_us"])
                out[f"{key}.best.label"] = point.label
                out[f"{key}.best.candidate"] = point.candidate.id
                out[f"{key}.best.changed"] = changed_params(point.candidate, self.seeds)
                for figure in ("mean_latency_us", "mean_latency_us_cupti", "mean_speedup", "fitness"):
                    out[f"{key}.best.{figure}"] = best[figure]
        return out


def _us(value: float | None) -> str:
    return f"{value:9.2f}" if value is not None else "        -"


def point_line(m: Measured, figures: dict[str, Any], shapes: int) -> str:
    """The printed line of one point: count, elapsed, label, status, latencies, why not."""
    passed = m.evaluation.status is Status.PASSED
    line = (f"{m.index + 1:5d} {m.elapsed_s:6.0f}s  {m.point.label[:44]:44s} {figures['status']:13s} "
            f"{figures['passed_shapes']:2d}/{shapes:<2d} {_us(figures['mean_latency_us'] if passed else None)} "
            f"{_us(figures['mean_latency_us_cupti'] if passed else None)}  ({m.wall_s:.1f} s)")
    if not passed:
        line += "  " + (m.evaluation.feedback.strip().splitlines() or [""])[0][:100]
    return line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--seeds", required=True, help="comma-separated seed names or manifest paths")
    parser.add_argument("--shapes", default="quick", help="a subset name or shape ids, comma-separated")
    parser.add_argument("--budget", type=float, default=280.0,
                        help="wall-clock seconds from start; no evaluation runs past them")
    parser.add_argument("--timeout", type=float, default=60.0, help="limit for one evaluation (s)")
    parser.add_argument("--sample-seed", type=int, default=SAMPLE_SEED,
                        help="seed of the uniform draws (another one per session adds new points)")
    parser.add_argument("--skip", action="append", default=[], type=Path, metavar="LANDSCAPE",
                        help="an earlier landscape (.jsonl or .jsonl.gz, same shapes) whose points "
                             "are not measured again; may be repeated")
    parser.add_argument("--max-points", type=int, default=None, help="stop after this many points")
    parser.add_argument("--bank-memory-gb", type=float, default=None,
                        help="the judge's memory for inputs (SandboxConfig.bank_memory_gb; default "
                             "45%% of the device): fused_moe's quick shapes take about 56 GB, past an "
                             "H100's default, and are remade for every point where they do not fit")
    parser.add_argument("--lanes", type=int, default=None,
                        help="sets of the judge's slots (SandboxConfig.lanes; default 2): 1 halves "
                             "the memory a shape takes, so that fused_moe's eight quick shapes (about "
                             "56 GB with two lanes) stay made on an H100, where with two each point "
                             "remade six of them (12-40 s a point, 2026-12-06)")
    parser.add_argument("--quiet-graphs", action="store_true",
                        help="graph replays wait for starting spares (SandboxConfig.quiet_graphs): on "
                             "the H200 a process's first shapes were timed inflated without it")
    parser.add_argument("--no-triton-store", dest="triton_store", action="store_false",
                        help="every process compiles its Triton kernels itself (SandboxConfig."
                             "triton_store off): the side by side of the store's gain")
    parser.add_argument("--no-triton-warm", dest="triton_warm", action="store_false",
                        help="no Triton kernels compiled ahead of their points (SandboxConfig."
                             "triton_warm_workers 0): the side by side of warming's gain")
    parser.add_argument("--grid", default="", metavar="NAME,NAME,...",
                        help="measure the full grid of these parameters (others at the seed's "
                             "defaults, in a seeded order) instead of neighbours and draws: a "
                             "landscape a strategy comparison cannot leave")
    args = parser.parse_args(argv)
    if args.budget <= 0 or args.timeout <= 0:
        raise UsageError("--budget and --timeout must be positive")
    if args.lanes is not None and args.lanes < 1:
        raise UsageError("--lanes must be at least 1")
    if args.max_points is not None and args.max_points < 1:
        raise UsageError("--max-points must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        budget = Budget(total_s=args.budget, timeout_s=args.timeout)
        workload = load_workload(args.workload)
        shapes = workload.resolve_shapes(args.shapes)
        seeds = resolve_seeds(workload, args.seeds)
        for seed in seeds:
            unknown = [n for n in args.grid.split(",") if n and n not in seed.space]
            if unknown:
                raise UsageError(f"--grid: {seed.name} declares no parameter {unknown}")
        known = measured_ids(args.skip, shapes)
    except (UsageError, WorkloadError, LandscapeFileError) as exc:
        print(f"landscape_gpu: {exc}", file=sys.stderr)
        return 2
    return record_landscape(args, budget, workload, shapes, seeds, known)


def record_landscape(args: argparse.Namespace, budget: Budget, workload: Workload, shapes: list[str],
                     seeds: list[Candidate], known: set[str]) -> int:
    from evokernel.evaluate.baseline import BaselineError
    from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator

    names = "+".join(s.name for s in seeds)
    out_dir = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{workload.name}.landscape"
    tally = Tally(workload, shapes, seeds)
    grid_names = [n for n in args.grid.split(",") if n]
    points = landscape_points(seeds, args.sample_seed, known, grid_names)
    environment: dict[str, str] = {}
    stopped = ""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    print(f"{workload.name}: seeds {names}, {len(shapes)} shapes ({args.shapes}), budget {args.budget:.0f} s, "
          f"{len(known)} points already measured (--skip)", flush=True)
    try:
        lanes = {} if args.lanes is None else {"lanes": args.lanes}
        judge = SandboxEvaluator(workload.name, config=SandboxConfig(
            timeout_s=args.timeout, bank_memory_gb=args.bank_memory_gb, quiet_graphs=args.quiet_graphs,
            triton_store=args.triton_store, **lanes,
            **({} if args.triton_warm else {"triton_warm_workers": 0})))
    except BaselineError as exc:  # a FlashInfer-Trace folder without this definition
        print(f"landscape_gpu: {exc}", file=sys.stderr)
        return 2
    try:
        with judge as ev, \
                LandscapeFile(free_path(out_dir / f"landscape-{workload.name}-{names}.jsonl")) as landscape:
            landscape_path = landscape.path
            run = PointRun(ev, shapes, budget)
            try:
                environment = ev.environment()
                ev.warm_up(shapes)  # baseline, inputs and spares: the first point is not timed cold
                spent = ", ".join(f"{k} {v:.0f}" for k, v in ev.baseline_spent.items())
                print(f"setup {budget.elapsed():.0f} s on {environment.get('device')}; baseline "
                      f"{environment.get('baseline')} ({spent or 'timings cached'}); writing "
                      f"{landscape.path}", flush=True)
                print(f"{'#':>5} {'elapsed':>7s}  {'point':44s} {'status':13s} shapes {'judge us':>9s} "
                      f"{'cupti us':>9s}", flush=True)
                for m in run.measure(points):
                    landscape.add(m.point.candidate, m.evaluation, shapes)
                    print(point_line(m, tally.add(m), len(shapes)), flush=True)
                    if args.max_points is not None and m.index + 1 >= args.max_points:
                        run.stopped = f"--max-points {args.max_points} reached"
                        break
                    if (m.index + 1) % SUMMARY_EVERY == 0:
                        write_summary(args, prefix, tally, environment, landscape.path, budget, "running")
                stopped = run.stopped
            except Terminated:
                stopped = "SIGTERM"
            if ev.triton_store is not None:
                ev.wait_retired()  # the last process's kernels are admitted as it retires
                tally.triton_kernels = {"admitted": ev.triton_store.admitted,
                                        "offered": ev.triton_store.offered,
                                        "warmed": ev.warmed_ahead()}
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"stopped: {stopped}", flush=True)
    path = write_summary(args, prefix, tally, environment, landscape_path, budget, stopped)
    for key, value in tally.metrics(prefix).items():
        if value:
            print(f"{key}: {value}")
    print(f"wrote {landscape_path} ({len(tally.figures)} points) and {path} in {budget.elapsed():.0f} s")
    return 0


def write_summary(args: argparse.Namespace, prefix: str, tally: Tally, environment: dict[str, str],
                  landscape: Path, budget: Budget, stopped: str) -> Path:
    """The JSON of metrics and the CSV of rows (benchmarks/record.py), as far as measured."""
    metrics = {
        f"{prefix}.seeds": [s for s in tally.seeds], f"{prefix}.shapes": args.shapes,
        f"{prefix}.shape_count": len(tally.shapes), f"{prefix}.sample_seed": args.sample_seed,
        f"{prefix}.budget_s": args.budget, f"{prefix}.timeout_s": args.timeout,
        f"{prefix}.quiet_graphs": args.quiet_graphs, f"{prefix}.triton_store": args.triton_store,
        f"{prefix}.triton_warm": args.triton_warm,
        **{f"{prefix}.triton_kernels.{k}": v for k, v in tally.triton_kernels.items()},
        f"{prefix}.skip": [str(p) for p in args.skip], f"{prefix}.elapsed_s": round(budget.elapsed(), 1),
        f"{prefix}.stopped": stopped, f"{prefix}.file": landscape.name, **tally.metrics(prefix),
    }
    what = f"landscape-{tally.workload.name}-{'+'.join(tally.seeds)}"
    return write_result(what, metrics, environment or {"device": "unknown"}, tally.rows)


if __name__ == "__main__":
    sys.exit(main())
