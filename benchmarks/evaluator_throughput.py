"""Evaluator throughput, the judge side by side with the design before it, in one run.

    python benchmarks/evaluator_throughput.py --workload dsa_topk --shapes quick \
        --seed-name cuda_radix --deadline 90 --designs judge,legacy

``judge`` is evokernel's evaluator (evokernel/evaluate/sandbox.py) as a search gets it;
``pipelined`` the same with ``SandboxConfig.pipeline`` on and two calls in flight, as the
runtimes then keep them (each candidate's checks after its last shape overlap the next
one's start); ``one_lane`` the same
with one lane of shared chunks (each candidate loads only once the last one is dead and
its chunks scrubbed, as before lanes.py); a ``_collect_first`` suffix (``judge_collect_first``,
``one_lane_collect_first``) reads each process's CUPTI records before the deferred checks
start, not beside them (``SandboxConfig.collect_first``); ``serial`` the same with ``overlap_checks`` off
(each check made while the candidate's process waits, as before the checks overlapped
its capture, CUPTI report and kill); ``fresh_spawn`` the judge with every candidate's
process a fresh interpreter, not forked by the fork server (``SandboxConfig.fork_server``
off, as before zygote.py); a ``_quiet`` suffix on any of them makes graph replays wait for
starting spares as well (``SandboxConfig.quiet_graphs``; each design then records
``inflated_share``, the share of shapes whose judge figure is over twice their CUPTI
span, first shapes and later ones apart); ``legacy`` is the
in-process harness it replaced, kept in benchmarks/legacy_evaluator/ only to be
measured here. Each design gets the same candidates in the same order and the same
deadline; its per-run setup (baseline timings, the judge's inputs) is done before
its clock starts, as a search does it once per run.

Candidates are the points of one seed's knob grid, with its launch parameters held
at their defaults, in a seeded random order (distinct ids: nothing comes from a
cache), evaluated until the grid or the deadline is exhausted. While they run, a
thread samples the GPU's utilisation through NVML (the share of time a kernel was
executing); GPU-busy seconds are its integral. Records
``evaluator.<shapes>.candidates_per_min`` and ``evaluator.<shapes>.wall_over_gpu_busy``,
and writes every (candidate, evaluation) as JSON lines: a landscape that
``evokernel.evaluate.replay.ReplayEvaluator`` serves without a GPU.

The breakdown (``breakdown_s``) is the mean seconds per candidate of each step. Steps
named ``behind_*`` are the previous candidate's retiring (its CUPTI report, kill and
scrub), overlapped with this one's work; ``take_s`` is the part of ``process_wait_s``
spent waiting for a started process; ``spare_start_s`` is how long the process it got
had taken to start (overlapped with earlier candidates: the pool runs dry when that
exceeds the spares times the seconds a candidate).

The evaluator builds ahead as a search does (the grid is handed to ``prepare``, so
CPU processes compile the next candidates while the GPU times the current one);
``--prebuild-workers 0`` turns that off, to measure what it saves. Each row records
the candidate's build seconds and whether its cubin came from the build cache.

``--profile`` samples the judge's thread (the one that calls ``evaluate``) every 2 ms
while it evaluates and writes, per design, ``profile-<workload>-<design>.txt``: the
functions most often on its stack, by samples at the top (own) and anywhere on it
(cumulative); a wait in C (a socket, a device sync) counts for the Python function
waiting. Only that thread: the lanes' threads (retiring, deferred checks) and the
compilers are not in it (cProfile is not used: from Python 3.12 it sees every thread).
The sampling thread takes the GIL 500 times a second: take the throughput from a run
without it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import random
import resource
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from benchmarks.timing_inflation import inflated_shares
from evokernel.candidate import Candidate, Param
from evokernel.evaluate import concurrent_calls
from evokernel.evaluate.result import Evaluation
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.runtime import LocalRuntime
from evokernel.workload import Workload, load_workload


class UtilisationSampler:
    """Integrates NVML GPU utilisation over time in a background thread (nothing without
    a GPU: ``busy_s`` stays 0 and the ratio is not recorded)."""

    def __init__(self, period_s: float = 0.05) -> None:
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:  # no NVML, no GPU: the CPU breakdown is still worth having
            print(f"no GPU utilisation sampling: {type(exc).__name__}: {exc}", file=sys.stderr)
        self.period_s = period_s
        self.busy_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while self._nvml is not None and not self._stop.is_set():
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


class HostCpu:
    """The host's CPU over a block: the share of all cores busy (``/proc/stat``; None where
    it cannot be read) and this process's own CPU seconds, every thread of the judge's
    (``resource.getrusage``). A judge near one core's worth of CPU over the wall time is
    bound by its own Python; a host near all its cores busy, by what else runs there (the
    spare processes starting, above all)."""

    def __enter__(self) -> HostCpu:
        self._stat, self._own, self._wall = _cpu_ticks(), _own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._wall
        self.judge_cpu_s = _own_cpu_s() - self._own
        self.judge_cpu_over_wall = self.judge_cpu_s / wall if wall > 0 else None
        end = _cpu_ticks()
        self.busy_share: float | None = None
        if self._stat is not None and end is not None:
            total = end[0] - self._stat[0]
            self.busy_share = 1.0 - (end[1] - self._stat[1]) / total if total > 0 else None


def _cpu_ticks() -> tuple[int, int] | None:
    """(all ticks, idle and iowait ticks) of the host's CPUs so far, or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(f) for f in fields]
    return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def knob_grid(seed: Candidate, rng: random.Random) -> list[Candidate]:
    """Every knob combination of ``seed`` (launch parameters fixed), shuffled."""
    names = sorted(seed.knob_space)
    grid = [dict(zip(names, values, strict=True))
            for values in itertools.product(*(seed.knob_space[n].choices for n in names))]
    rng.shuffle(grid)
    fixed = {n: Param(choices=(p.initial,)) for n, p in seed.launch_space.items()}
    base = seed.model_copy(update={"launch_space": fixed}).revalidated()
    out = [base.with_params(knobs=knobs, operator="landscape", generation=0) for knobs in grid]
    return list({c.id: c for c in out}.values())


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def design_config(design: str, prebuild_workers: int | None) -> SandboxConfig | None:
    """The judge's configuration of a design (None: ``legacy``); exits on an unknown name."""
    unquiet = design.removesuffix("_quiet")
    quiet = unquiet != design  # graph replays wait for starting spares too
    base, _, variant = unquiet.partition("_collect_first")
    if base == "fresh_spawn" and variant == "":  # the judge with each process a fresh interpreter
        return SandboxConfig(timeout_s=300, prebuild_workers=prebuild_workers, fork_server=False,
                             quiet_graphs=quiet)
    if base in ("judge", "pipelined", "one_lane", "serial") and variant == "":
        return SandboxConfig(
            timeout_s=300, prebuild_workers=prebuild_workers, overlap_checks=base != "serial",
            lanes=1 if base == "one_lane" else 2, collect_first=base != unquiet,
            pipeline=base == "pipelined", quiet_graphs=quiet)
    if design != "legacy":
        raise SystemExit(f"unknown design {design!r}: judge, pipelined, one_lane, serial (each "
                         "with an optional _collect_first suffix), fresh_spawn (each with an "
                         "optional _quiet suffix), or legacy")
    return None


def make_evaluator(design: str, workload: str, prebuild_workers: int | None) -> Any:
    config = design_config(design, prebuild_workers)
    if config is not None:
        return SandboxEvaluator(workload, config=config)
    from benchmarks.legacy_evaluator.sandbox import SandboxConfig as LegacyConfig
    from benchmarks.legacy_evaluator.sandbox import SandboxEvaluator as Legacy

    return Legacy(workload, config=LegacyConfig(timeout_s=300, prebuild_workers=prebuild_workers))


class _UntilDeadline(deque[tuple[float, Candidate]]):
    """Work for ``LocalRuntime.evaluate_stream``: the candidates handed over one at a time,
    when the runtime takes one, tagged with that time; none past ``deadline``
    (``time.perf_counter``). It holds none itself (the runtime's ``prepare`` sees none:
    ``measure`` prepared them all before its clock started)."""

    def __init__(self, candidates: list[Candidate], deadline: float) -> None:
        super().__init__()
        self._waiting = iter(candidates)
        self._next = next(self._waiting, None)
        self._deadline = deadline

    def __bool__(self) -> bool:
        return self._next is not None and time.perf_counter() <= self._deadline

    def popleft(self) -> tuple[float, Candidate]:
        if not self:
            raise IndexError("no candidate left before the deadline")
        candidate, self._next = self._next, next(self._waiting, None)
        assert candidate is not None
        return time.perf_counter(), candidate


def evaluations(ev: Any, candidates: list[Candidate], shapes: list[str],
                deadline: float) -> Iterator[tuple[Candidate, Any, float]]:
    """(candidate, evaluation, when it was handed over), as a search's runtime gets them
    (``LocalRuntime``: the evaluator's ``concurrent_calls`` in flight; one at a time in
    this thread), none handed over past ``deadline``."""
    work = _UntilDeadline(candidates, deadline)
    by_id = {c.id: c for c in candidates}
    for handed, evaluation in LocalRuntime(lambda: ev).evaluate_stream(work, shapes):
        yield by_id[evaluation.candidate_id], evaluation, handed


def measure(design: str, workload: Workload, shapes: list[str], candidates: list[Candidate],
            args: argparse.Namespace, out_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                           dict[str, str]]:
    landscape_path = out_dir / f"landscape-{workload.name}-{args.seed_name}-{design}.jsonl"
    with make_evaluator(design, workload.name, args.prebuild_workers) as ev:
        setup = time.perf_counter()
        if design != "legacy":
            ev.warm_up(shapes)  # once per run: the baseline, the judge's inputs, the spares
        else:
            ev.reference_timings(shapes)
        setup = time.perf_counter() - setup
        environment = ev.environment()
        ev.prepare(candidates)
        prebuild_workers = ev.prebuild_workers()
        rows = []
        judged: list[Evaluation] = []
        in_flight = concurrent_calls(ev)  # as a search's runtime keeps them
        if args.profile and in_flight > 1:
            raise SystemExit(f"--profile samples one thread; design {design} keeps {in_flight} "
                             "evaluations in flight: profile one without the pipeline")
        profiling = StackSampler(threading.get_ident()) if args.profile else contextlib.nullcontext()
        with landscape_path.open("w") as landscape, UtilisationSampler() as sampler, \
                profiling as profiler, HostCpu() as host:
            started = time.perf_counter()
            for candidate, result, t0 in evaluations(ev, candidates, shapes,
                                                     started + args.deadline):
                landscape.write(json.dumps({
                    "candidate": candidate.model_dump(mode="json"),
                    "evaluation": result.model_dump(mode="json", exclude={"log"}),
                    "shapes": shapes,
                }) + "\n")
                landscape.flush()
                judged.append(result)
                spent = dict(getattr(result, "overheads", {}) or {})
                for shape in result.shapes:
                    for key, value in shape.stats.items():
                        if key.startswith(("phase_", "cupti_")) and key.endswith("_ms"):
                            name = key.removeprefix("phase_")[: -len("_ms")] + "_s"
                            spent[name] = spent.get(name, 0.0) + value / 1e3
                rows.append({
                    **{f"spent_{k}": v for k, v in spent.items()},
                    "design": design, "candidate": candidate.id, "name": candidate.name,
                    "params": str(candidate.params), "status": result.status.value,
                    "fitness": result.fitness, "wall_s": time.perf_counter() - t0,
                    "device_s": result.device_s,
                    "build_s": result.resources.get("build_s"),
                    "build_cached": result.resources.get("build_cached"),
                })
                print(f"{design:6s} {candidate.name:20s} {result.status.value:12s} "
                      f"{rows[-1]['wall_s']:.2f} s fitness={result.fitness}", flush=True)
            wall = time.perf_counter() - started
        if profiler is not None:
            profiler.write(out_dir / f"profile-{workload.name}-{design}.txt", len(rows))
        busy = sampler.busy_s
    done = len(rows)
    metrics = {
        "candidates": done,
        "throughput_per_min": done / wall * 60,
        "wall_s": wall,
        "setup_s": setup,
        "gpu_busy_s": busy,
        "wall_over_gpu_busy": wall / busy if busy > 0 else None,
        "passed": sum(r["status"] == "PASSED" for r in rows),
        "prebuild_workers": prebuild_workers,
        "build_s_mean": _mean([r["build_s"] for r in rows]),
        "build_cached_share": _mean([r["build_cached"] for r in rows]),
        "landscape": landscape_path.name,
        **(inflated_shares(judged) if design != "legacy" else {}),
        "calls_in_flight": in_flight,
        "host_cores": os.cpu_count(),
        "host_cpu_busy_share": host.busy_share,
        "judge_cpu_s": host.judge_cpu_s,
        "judge_cpu_over_wall": host.judge_cpu_over_wall,
    }
    # where a candidate's wall time went (judge only): mean seconds per candidate
    spent_keys = sorted({k for r in rows for k in r if k.startswith("spent_")})
    for key in spent_keys:
        metrics[f"breakdown_s.{key[len('spent_'):]}"] = _mean([r.get(key, 0.0) for r in rows])
    return metrics, rows, environment


class StackSampler:
    """Counts, every ``period_s``, the functions on one thread's stack: at its top (own)
    and anywhere on it (cumulative, once a sample however deep the recursion)."""

    def __init__(self, thread_id: int, period_s: float = 0.002) -> None:
        self.thread_id, self.period_s = thread_id, period_s
        self.samples = 0
        self.own: collections.Counter[str] = collections.Counter()
        self.cumulative: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _name(frame: Any) -> str:
        code = frame.f_code
        return f"{Path(code.co_filename).name}:{code.co_firstlineno}({code.co_name})"

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            self.samples += 1
            self.own[self._name(frame)] += 1
            seen = set()
            while frame is not None:
                seen.add(self._name(frame))
                frame = frame.f_back
            self.cumulative.update(seen)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def write(self, path: Path, candidates: int, top: int = 45) -> None:
        """The top functions by own samples, then by cumulative samples, each with its
        share of all samples and its seconds a candidate (samples x period / candidates)."""
        lines = [f"# the judge's thread sampled every {self.period_s * 1e3:.0f} ms over "
                 f"{candidates} candidates: {self.samples} samples"]
        for title, counts in (("own (at the top of the stack)", self.own),
                              ("cumulative (anywhere on the stack)", self.cumulative)):
            lines += ["", f"## {title}", f"{'share':>7s} {'s/cand':>8s}  function"]
            for name, count in counts.most_common(top):
                share = count / max(1, self.samples)
                per_candidate = count * self.period_s / max(1, candidates)
                lines.append(f"{share:7.1%} {per_candidate:8.4f}  {name}")
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="dsa_topk")
    parser.add_argument("--shapes", default="quick")
    parser.add_argument("--seed-name", default="cuda_radix")
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds of evaluation per design")
    parser.add_argument("--designs", default="judge,legacy")
    parser.add_argument("--order-seed", type=int, default=0)
    parser.add_argument("--prebuild-workers", type=int, default=None,
                        help="build-ahead processes (default: each evaluator's own)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the judge's thread; writes profile-<workload>-<design>.txt")
    args = parser.parse_args()

    workload = load_workload(args.workload)
    shapes = workload.resolve_shapes(args.shapes)
    (seed,) = [s for s in workload.seeds() if s.name == args.seed_name]
    candidates = knob_grid(seed, random.Random(args.order_seed))
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {"evaluator.shapes": args.shapes, "evaluator.grid_size": len(candidates)}
    rows: list[dict[str, Any]] = []
    environment: dict[str, str] = {}
    designs = args.designs.split(",")
    for design in designs:
        design_config(design, None)  # an unknown name stops the run before anything is timed
    for done, design in enumerate(designs, start=1):
        found, design_rows, env = measure(design, workload, shapes, candidates, args, out_dir)
        environment = environment or env
        prefix = "evaluator" if design == "judge" else f"evaluator.{design}"
        metrics |= {f"{prefix}.{k}": v for k, v in found.items()}
        rows += design_rows
        if done < len(designs):  # a run cut short (a stage's time limit) keeps what it measured
            write_result(f"throughput-{workload.name}",
                         {**metrics, "evaluator.complete": False}, environment, rows)
    metrics["evaluator.complete"] = True
    if "evaluator.throughput_per_min" in metrics and "evaluator.legacy.throughput_per_min" in metrics:
        metrics["evaluator.throughput_over_legacy"] = (
            metrics["evaluator.throughput_per_min"] / metrics["evaluator.legacy.throughput_per_min"])
    for k, v in metrics.items():
        print(f"{k} = {v}")
    print(f"wrote {write_result(f'throughput-{workload.name}', metrics, environment, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
