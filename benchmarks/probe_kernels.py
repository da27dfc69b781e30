"""Call a workload's seeds (and variants of them) on chosen shapes, with no judge (GPU, trusted).

    python benchmarks/probe_kernels.py --workload dsa_topk --seed cuda_family \\
        --variant fast:MS_WARPS=16,ML_WARPS=16 --shapes quick [--calls 20] [--ncu] [--check] [--phases] \\
        [--l2 cold,code,warm]

Without ``--ncu`` it prints, per subject and shape, the median CUPTI span of one eager
call with L2 flushed (the judge's method, without the judge's isolation) and writes
``probe-kernels-<workload>`` to benchmarks/results/ (or $OUT). With ``--ncu`` it only
makes the calls (``--calls`` per shape, L2 flushed between them), for Nsight Compute
to profile from outside, since ncu and CUPTI's activity API cannot both hold the
device: ``bash benchmarks/gpu_run.sh ncu`` runs it so. With ``--check``, the outputs of
two calls per subject and shape (outputs poisoned before each) go through the workload's
own checker against its expected outputs, and a PASSED or INCORRECT line is printed for
each; the exit status is 1 if any was INCORRECT.

With ``--phases`` each subject is also built with ``#define EVK_PHASES 1`` ahead of its
``.cu`` source (this probe's own build switch, not a parameter: the search never sees
it), which turns on the phase timers of cuda_family.cu: thread 0 of every band CTA
stamps %globaltimer and %clock64 at each phase boundary into the module's ``evk_phases``
array. The probe makes ``--calls`` calls of that build per shape (buffer zeroed and L2
flushed before each), reads the stamps back, and prints per shape, for the CTAs that
selected (the last of a row), the others that scored, and those of short rows: the
median over calls of each phase's end (since the call's first CTA entry) and of its
duration (since the same CTA's previous stamp), also in SM cycles. These go into the
result rows (``kind: phase``) beside the CUPTI span of the phase build
(``phase_cupti_us``), whose difference from ``cupti_us`` is the timers' own cost.

``--l2 cold,code,warm`` measures each subject under several cache states (``l2`` in the
rows; ``cold`` alone by default): ``cold`` flushes L2 before each call, as FlashInfer-Bench
does; ``code`` flushes it and then makes one untimed call on a second input set of the
same shape (drawn with seed 1), so the timed call finds its kernels' instructions,
constants and workspaces in the caches but its inputs in device memory; ``warm`` does
not flush. The flush evicts instructions as well as data, so ``cold`` minus ``code`` is
what fetching the kernels' code (and touching their workspaces) costs a call.

A probe for finding where a kernel's time goes, not a figure for the README: only the
judge's results count as results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
import yaml

from evokernel.candidate import Candidate
from evokernel.evaluate.build import (
    Runner,
    arch_for_capability,
    build_cuda_kernels,
    build_runner,
    check_signature,
    import_sources,
)
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


# -- phase timers (--phases) -------------------------------------------------------------

PHASE_DEFINE = "EVK_PHASES"
PHASE_BUFFER = "evk_phases"
PHASES = ("entry", "q", "scored", "handoff", "loaded", "bin0", "cand", "pass1", "pass2", "pass3",
          "output", "exit")
"""The PH_* stamps of cuda_family.cu, in slot order."""
SLOTS = 16
"""EVK_SLOTS: a record is SLOTS globaltimer stamps (ns), then SLOTS %clock64 stamps."""
META = 15
"""EVK_META: the times slot holding row | cta << 16 | launch << 24."""
RECORDS = 2048
"""EVK_RECORDS: records in the buffer, the last an overflow sink."""
GROUPS = ("select", "score", "short")
"""The CTA that selected (fused: the row's last to arrive; cluster: the leader; two_pass:
the second launch), the others that scored, and those of rows of at most k tokens. A CTA
is the selecting one when it stamps ``loaded``: with cuda_family's GATHER split only the
leader does (at its handoff), while the others also stamp ``bin0`` and ``cand`` (their
share of the select) before they exit, and stay in ``score``."""


def with_define(candidate: Candidate, name: str) -> Candidate:
    """The candidate with ``#define NAME 1`` ahead of its first ``.cu`` source, line numbers
    kept: a build switch of this probe only (its id changes with it, so no cache mixes the
    two builds), not a parameter."""
    first = min(path for path in candidate.sources if path.endswith(".cu"))
    sources = dict(candidate.sources)
    sources[first] = f"#define {name} 1\n#line 1\n{sources[first]}"
    return candidate.model_copy(update={"sources": sources})


def build_phase_runner(subject: Candidate, directory: Path, arch: str,
                       arguments: Sequence[str]) -> tuple[Runner, torch.Tensor]:
    """``subject`` built with the phase timers on, and its ``evk_phases`` buffer as a torch
    tensor (int64, on the device). build_runner's steps, keeping the module it loads."""
    candidate = with_define(subject, PHASE_DEFINE)
    kernels, _ = build_cuda_kernels(candidate, arch)
    module = import_sources(candidate, directory)
    run = getattr(module, candidate.entry_point.split("::")[1])(dict(candidate.params), kernels)
    check_signature(run, arguments)
    import cupy

    address = kernels.module.get_global_var(PHASE_BUFFER)  # cuModuleGetGlobal: an address
    address = address if isinstance(address, int) else address.ptr
    size = RECORDS * 2 * SLOTS  # the kernel's EVK_RECORDS * 2 * EVK_SLOTS (a test keeps them equal)
    memory = cupy.cuda.UnownedMemory(address, 8 * size, kernels.module)
    array = cupy.ndarray((size,), dtype=cupy.int64, memptr=cupy.cuda.MemoryPointer(memory, 0))
    return run, torch.as_tensor(array, device="cuda")


@dataclass(frozen=True)
class CtaRecord:
    """One CTA's stamps in one call: phase name -> globaltimer ns and SM cycles."""

    row: int
    cta: int
    launch: int
    ns: dict[str, int]
    cycles: dict[str, int]

    @property
    def group(self) -> str:
        if "loaded" in self.ns:
            return "select"
        return "score" if "q" in self.ns else "short"


def decode_records(buffer: np.ndarray) -> list[CtaRecord]:
    """The records of one call (a copy of the whole buffer); a CTA that never ran has no
    entry stamp and no record."""
    table = np.asarray(buffer, dtype=np.int64).reshape(RECORDS, 2 * SLOTS)
    if table[-1].any():
        raise RuntimeError(f"more CTAs than the {RECORDS - 1} records of {PHASE_BUFFER}")
    records = []
    for record in table[table[:, 0] != 0]:
        meta = int(record[META])
        present = [(i, name) for i, name in enumerate(PHASES) if record[i]]
        records.append(CtaRecord(
            row=meta & 0xFFFF, cta=(meta >> 16) & 0xFF, launch=(meta >> 24) & 0xFF,
            ns={name: int(record[i]) for i, name in present},
            cycles={name: int(record[SLOTS + i]) for i, name in present}))
    return records


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def phase_table(calls: Sequence[Sequence[CtaRecord]]) -> list[dict[str, Any]]:
    """Per group and phase, the median over calls of: the CTAs stamping it (``ctas``),
    the median and the latest of their ends since the call's earliest entry (``end_us``,
    ``end_max_us``), the median of their durations since the CTA's previous stamp
    (``dur_us``; for ``entry``, its start after the earliest) and the same in SM cycles
    (``dur_cycles``; none for ``entry``). ``calls``: the calls in which some CTA stamped it."""
    per: dict[tuple[str, str], list[tuple[float, float, float, float, float | None]]] = {}
    for records in calls:
        if not records:
            continue
        t0 = min(r.ns["entry"] for r in records)
        for group in GROUPS:
            members = [r for r in records if r.group == group]
            for phase in PHASES:
                ends, durs, cycles = [], [], []
                for r in members:
                    if phase not in r.ns:
                        continue
                    ends.append(r.ns[phase] - t0)
                    before = [p for p in PHASES[: PHASES.index(phase)] if p in r.ns]
                    if before:
                        durs.append(r.ns[phase] - r.ns[before[-1]])
                        cycles.append(r.cycles[phase] - r.cycles[before[-1]])
                    else:
                        durs.append(r.ns[phase] - t0)
                if ends:
                    per.setdefault((group, phase), []).append(
                        (len(ends), statistics.median(ends), max(ends), statistics.median(durs),
                         statistics.median(cycles) if cycles else None))
    rows = []
    for group in GROUPS:
        for phase in PHASES:
            got = per.get((group, phase))
            if not got:
                continue
            cycles_seen = [c[4] for c in got if c[4] is not None]
            rows.append({
                "group": group, "phase": phase, "calls": len(got),
                "ctas": _median([c[0] for c in got]),
                "end_us": _us(_median([c[1] for c in got])),
                "end_max_us": _us(_median([c[2] for c in got])),
                "dur_us": _us(_median([c[3] for c in got])),
                "dur_cycles": _median(cycles_seen),
            })
    return rows


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 3)


def phase_summary(calls: Sequence[Sequence[CtaRecord]]) -> dict[str, float | None]:
    """Medians over calls of the in-kernel span (latest exit less earliest entry), the
    smallest nonzero gap between two stamps (the timer's visible step), and each CTA's
    cycles per ns between its entry and exit stamps (its SM clock, GHz)."""
    spans, steps, clocks = [], [], []
    for records in calls:
        if not records:
            continue
        stamps = np.unique([t for r in records for t in r.ns.values()])
        gaps = np.diff(stamps)
        if (gaps > 0).any():
            steps.append(float(gaps[gaps > 0].min()))
        exits = [r.ns["exit"] for r in records if "exit" in r.ns]
        if exits:
            spans.append(max(exits) - min(r.ns["entry"] for r in records))
        for r in records:
            if "exit" in r.ns and r.ns["exit"] > r.ns["entry"]:
                clocks.append((r.cycles["exit"] - r.cycles["entry"]) / (r.ns["exit"] - r.ns["entry"]))
    return {"in_kernel_span_us": _us(_median(spans)), "timer_step_ns": _median(steps),
            "sm_ghz": _median(clocks)}


def format_phase_table(rows: Sequence[dict[str, Any]]) -> str:
    def cell(value: Any, width: int) -> str:
        if value is None:
            return "-".rjust(width)
        return f"{value:{width}.2f}" if isinstance(value, float) else str(value).rjust(width)

    lines = ["  group   phase      ctas   end_us  end_max_us   dur_us  dur_cycles"]
    for r in rows:
        cycles = None if r["dur_cycles"] is None else int(r["dur_cycles"])
        lines.append(f"  {r['group']:7s} {r['phase']:8s} {cell(r['ctas'], 6)} {cell(r['end_us'], 8)} "
                     f"{cell(r['end_max_us'], 11)} {cell(r['dur_us'], 8)} {cell(cycles, 11)}")
    return "\n".join(lines)


L2_STATES = ("cold", "code", "warm")


def preparation(state: str, flush: Any, other_call: Any) -> Any:
    """What runs untimed before each timed call for an ``--l2`` state (module docstring)."""
    if state == "cold":
        return flush
    if state == "code":
        def flush_then_other() -> None:
            flush()
            other_call()
        return flush_then_other
    if state == "warm":
        return lambda: None
    raise ValueError(f"--l2 {state!r}: one of {', '.join(L2_STATES)}")


def phase_calls(call: Any, buffer: torch.Tensor, before: Any, calls: int) -> list[list[CtaRecord]]:
    """``calls`` calls, ``before`` run (L2 flushed, in the default state) and then the stamp
    buffer zeroed before each, decoded."""
    got = []
    for _ in range(calls):
        before()
        buffer.zero_()
        call()
        got.append(decode_records(buffer.cpu().numpy()))
    return got


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
    parser.add_argument("--phases", action="store_true",
                        help=f"also build with {PHASE_DEFINE} and print the in-kernel phase times")
    parser.add_argument("--l2", default="cold",
                        help="cache states to time in, comma-separated: cold (L2 flushed), code "
                             "(flushed, then an untimed call on other inputs), warm (no flush)")
    args = parser.parse_args()
    states = [s for s in args.l2.split(",") if s]
    unknown = [s for s in states if s not in L2_STATES]
    if unknown or not states:  # refused before any build
        raise SystemExit(f"--l2 {args.l2!r}: states among {', '.join(L2_STATES)}")
    if args.phases and args.ncu:
        raise SystemExit("--phases reads its own timers: not with --ncu")

    workload = load_workload(args.workload)
    seeds = {s.name: s for s in workload.seeds()}
    if args.seed not in seeds:
        raise SystemExit(f"--seed {args.seed!r}: {args.workload} has {sorted(seeds)}")
    device = torch.device("cuda")
    arch = arch_for_capability(*torch.cuda.get_device_capability())
    shapes = workload.resolve_shapes(args.shapes)

    from evokernel.evaluate.timing import CuptiSpans, L2Flusher

    flush = L2Flusher(device)
    spans = None if args.ncu else CuptiSpans()
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    incorrect = 0
    arguments = [*workload.input_names, *workload.output_names]
    for name, subject in subjects_of(seeds[args.seed], args.variant):
        run, _ = build_runner(subject, Path(tempfile.mkdtemp()), arch=arch, arguments=arguments)
        timed = (build_phase_runner(subject, Path(tempfile.mkdtemp()), arch, arguments)
                 if args.phases else None)
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
            other = workload.make_inputs(shape, 1, device) if "code" in states else {}
            other_outputs = workload.allocate_outputs(shape, device) if other else []

            def other_call(run: Any = run, inputs: dict[str, Any] = other,
                           outputs: list[Any] = other_outputs) -> None:
                run(*inputs.values(), *outputs)

            for state in states:
                before = preparation(state, flush, other_call)
                got = [s for s in spans.measure([call] * args.calls, before) if s]
                median_us = statistics.median(got) * 1e3 if got else None
                row = {"subject": name, "shape": shape, **axes, "l2": state, "cupti_us": median_us,
                       "passed": passed, "params": subject.params if name != "default" else {}}
                rows.append(row)
                print(f"{name:12s} {shape[:8]} {axes} L2 {state}: CUPTI span median "
                      f"{median_us if median_us is None else round(median_us, 2)} us", flush=True)
                if timed is not None:
                    rows.extend(probe_phases(timed, inputs, outputs, other, other_outputs, flush,
                                             state, spans, args.calls, row))
            del other, other_outputs
    if rows:
        from benchmarks.record import write_result
        from evokernel.evaluate.environment import fingerprint

        means = {}
        for name in dict.fromkeys(r["subject"] for r in rows):
            for state in states:
                values = [r["cupti_us"] for r in rows if r["subject"] == name
                          and r.get("l2") == state and r.get("cupti_us")]
                suffix = "" if state == "cold" else f"_l2_{state}"
                means[f"{args.workload}.{args.seed}.{name}.mean_cupti_us{suffix}"] = (
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


def probe_phases(timed: tuple[Runner, torch.Tensor], inputs: dict[str, Any], outputs: list[Any],
                 other: dict[str, Any], other_outputs: list[Any], flush: Any, state: str,
                 spans: Any, calls: int, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The phase build on one shape in one ``--l2`` state (``other``: the second input set
    the ``code`` state calls first): its CUPTI span and stamp summary go into ``row`` (the
    plain build's), its phase table is printed and returned as rows (``kind: phase``)."""
    run, buffer = timed
    head = {k: v for k, v in row.items() if k not in ("cupti_us", "passed", "params")}

    def call() -> None:
        run(*inputs.values(), *outputs)

    def other_call() -> None:
        run(*other.values(), *other_outputs)

    before = preparation(state, flush, other_call)
    call()  # lazy set-up, workspaces (measure synchronises around each call)
    got = [s for s in spans.measure([call] * calls, before) if s]
    row["phase_cupti_us"] = statistics.median(got) * 1e3 if got else None
    stamped = phase_calls(call, buffer, before, calls)
    summary = phase_summary(stamped)
    row.update(summary)
    table = phase_table(stamped)
    if not table:
        print("  phases: no band CTA stamped (no scoring kernel on this shape)", flush=True)
        return []

    def shown(value: float | None, digits: int) -> str:
        return "-" if value is None else str(round(value, digits))

    print(f"  phases, median of {calls} calls: CUPTI span of the timed build "
          f"{shown(row['phase_cupti_us'], 2)} us, in-kernel span "
          f"{shown(summary['in_kernel_span_us'], 2)} us, timer step "
          f"{shown(summary['timer_step_ns'], 0)} ns, SM clock {shown(summary['sm_ghz'], 3)} GHz "
          "(end: since the call's first CTA entry; dur: since the CTA's previous stamp)", flush=True)
    print(format_phase_table(table), flush=True)
    return [{**head, "kind": "phase", **r} for r in table]


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
