"""The cascade for one candidate, run inside the isolated worker process.

build -> correctness on fresh inputs (``trials`` sets per shape; outputs poisoned
before each call; inputs compared bit for bit afterwards) -> timing over the same
sets in rotation -> re-check of what the timed calls wrote -> one more call after
the inputs' contents were replaced in place (same addresses, new values), which
catches results cached by pointer -> speed-of-light check.

The reference's latency is not measured here; the parent caches it per shape and
attaches it (see sandbox.py). This module trusts nothing the candidate returns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.legacy_evaluator.timing import (
    TimingConfig,
    perf_counter,
    poison,
    time_cpu,
    time_gpu,
)
from evokernel.candidate import Candidate, Language
from evokernel.evaluate.build import (
    BuildError,
    arch_for_capability,
    build_runner,
    check_cuda_nvcc,
    cuda_source,
)
from evokernel.evaluate.build_cache import BuildCache
from evokernel.evaluate.check import check_outputs
from evokernel.evaluate.environment import fingerprint
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.workload import Workload


@dataclass
class HarnessConfig:
    device: str = "cpu"
    seed: int = 0
    trials: int = 3
    timing: TimingConfig = field(default_factory=TimingConfig)
    peak_bandwidth_gbps: float | None = None
    """Device memory bandwidth used for the speed-of-light bound (None: no bound)."""
    scratch: Path = Path(".")
    environment: dict[str, str] | None = None
    """The device's fingerprint if the parent already measured it (saves a probe per job)."""
    build_cache: Path | None = None
    """Where compiled kernels are shared between the evaluator's processes (None: no cache)."""


# Datasheet memory bandwidth by device name, for the speed-of-light bound. A datasheet
# figure is above what any kernel reaches, so a time under bytes/bandwidth is not real.
PEAK_BANDWIDTH_GBPS = {"H200": 4800.0, "H100": 3350.0, "B200": 8000.0, "A100": 2039.0}


def peak_bandwidth_gbps(device: str) -> float | None:
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next((bw for key, bw in PEAK_BANDWIDTH_GBPS.items() if key in name), None)


def trial_seed(seed: int, shape: str, trial: int) -> int:
    digest = hashlib.sha256(f"{seed}:{shape}:{trial}".encode()).digest()
    return int.from_bytes(digest[:6], "little")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN equals NaN; fp8 has no comparison kernels)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def _changed_inputs(inputs: dict[str, torch.Tensor], snapshot: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, t in inputs.items() if not _same(t, snapshot[n])]


GUARD_ELEMENTS = 4096
"""Poisoned elements before and after each output: a write past either end shows."""


@dataclass
class _Set:
    inputs: dict[str, torch.Tensor]
    outputs: list[torch.Tensor]
    expected: Sequence[torch.Tensor]
    snapshot: dict[str, torch.Tensor]
    guards: list[tuple[torch.Tensor, torch.Tensor]]
    """Per output, (its backing buffer, a copy of that buffer's poisoned guard bands)."""


def _guarded(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An output shaped like ``like`` inside a poisoned buffer; (view, buffer, guards)."""
    n = like.numel()
    buffer = torch.empty(n + 2 * GUARD_ELEMENTS, dtype=like.dtype, device=like.device)
    poison([buffer])
    view = buffer[GUARD_ELEMENTS : GUARD_ELEMENTS + n].view(like.shape)
    guards = torch.cat([buffer[:GUARD_ELEMENTS], buffer[GUARD_ELEMENTS + n :]]).clone()
    return view, buffer, guards


def _guards_intact(s: _Set) -> bool:
    for (buffer, expected), out in zip(s.guards, s.outputs, strict=True):
        n = out.numel()
        now = torch.cat([buffer[:GUARD_ELEMENTS], buffer[GUARD_ELEMENTS + n :]])
        if not _same(now, expected):
            return False
    return True


class _Failure(Exception):
    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _first_lines(text: str, n: int = 25) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")


def _call(fn: Callable[..., Any], s: _Set, device: torch.device, what: str) -> list[torch.Tensor]:
    """Call once; return the outputs as they were when the call returned (and synced).

    Checking that copy, not the live buffers, fails a kernel that finishes its work
    later (a background thread, an unsynchronised stream) however slow the check is.
    """
    try:
        fn(*s.inputs.values(), *s.outputs)
        _sync(device)
        return [out.clone() for out in s.outputs]
    except Exception as exc:
        tb = traceback.format_exc(limit=4)
        raise _Failure(Status.RUNTIME_ERROR, f"{what}: {type(exc).__name__}: {exc}\n{tb}") from exc


def _verify(
    wl: Workload, s: _Set, what: str, returned: Sequence[torch.Tensor] | None = None
) -> dict[str, float]:
    if not _guards_intact(s):
        raise _Failure(Status.INCORRECT, f"{what}: the candidate wrote outside its output buffer")
    changed = _changed_inputs(s.inputs, s.snapshot)
    if changed:
        raise _Failure(Status.INCORRECT, f"{what}: the candidate modified its inputs {changed}")
    verdict = check_outputs(wl, s.outputs if returned is None else returned, s.expected, s.inputs)
    if not verdict.ok:
        raise _Failure(Status.INCORRECT, f"{what}: {verdict.message}")
    return dict(verdict.stats)


def _fresh_set(wl: Workload, shape: str, seed: int, device: torch.device) -> _Set:
    inputs = wl.make_inputs(shape, seed, device)
    with torch.no_grad():
        expected = wl.reference(*inputs.values())
    _sync(device)
    outputs, guards = [], []
    for like in wl.allocate_outputs(shape, device):
        view, buffer, guard = _guarded(like)
        outputs.append(view)
        guards.append((buffer, guard))
    snapshot = {n: t.clone() for n, t in inputs.items()}
    return _Set(inputs, outputs, expected, snapshot, guards)


def evaluate_shape(
    wl: Workload, fn: Callable[..., Any], shape: str, config: HarnessConfig, device: torch.device
) -> tuple[ShapeResult, float]:
    """One shape: correctness on every trial, then timing. Returns the result and device seconds."""
    started = perf_counter()
    sets = []
    stats: dict[str, float] = {}
    try:
        for trial in range(config.trials):
            s = _fresh_set(wl, shape, trial_seed(config.seed, shape, trial), device)
            returned = _call(fn, s, device, f"trial {trial}")
            stats = _verify(wl, s, f"trial {trial}", returned)
            sets.append(s)

        calls = [(list(s.inputs.values()), s.outputs) for s in sets]
        # An unpredictable number of extra warm-ups: a kernel counting its calls to
        # tell checked calls from timed ones cannot know where timing starts.
        timing_config = dataclasses.replace(
            config.timing, warmup=config.timing.warmup + secrets.randbelow(5)
        )
        timer = time_gpu if device.type == "cuda" else time_cpu
        timing, launch = timer(fn, calls, timing_config)
        for i, s in enumerate(sets):
            _verify(wl, s, f"timed call on input set {i}")

        # Same addresses, new contents: a result cached by pointer is now wrong.
        fresh = _fresh_set(wl, shape, trial_seed(config.seed, shape, config.trials), device)
        target = sets[0]
        for name, tensor in target.inputs.items():
            tensor.copy_(fresh.inputs[name])
            target.snapshot[name] = fresh.snapshot[name]
        target.expected = fresh.expected
        poison(target.outputs)
        launch(0)
        _sync(device)
        stats = _verify(wl, target, "call after the inputs changed in place")

        timing = _speed_of_light(wl, fn, shape, config, device, sets, timing)
    except _Failure as failure:
        return (
            ShapeResult(shape=shape, status=failure.status, message=failure.message, stats=stats),
            perf_counter() - started,
        )
    return (
        ShapeResult(shape=shape, status=Status.PASSED, timing=timing, stats=stats),
        perf_counter() - started,
    )


def _speed_of_light(
    wl: Workload,
    fn: Callable[..., Any],
    shape: str,
    config: HarnessConfig,
    device: torch.device,
    sets: Sequence[_Set],
    timing: Timing,
) -> Timing:
    """Reject a time below what the memory system allows, after re-verifying the result.

    The floor is that of the lightest input set timed: the median over the rotation
    can be no lower than it for a kernel that really reads what it must.
    """
    if config.peak_bandwidth_gbps is None or device.type != "cuda":
        return timing
    costs = [c for s in sets if (c := wl.cost(s.inputs))]
    if not costs:
        return timing
    cost = min(costs, key=lambda c: c["bytes"])
    floor_ms = cost["bytes"] / (config.peak_bandwidth_gbps * 1e9) * 1e3
    if timing.median_ms >= floor_ms:
        return timing
    for extra in range(2):
        s = _fresh_set(wl, shape, trial_seed(config.seed, shape, 100 + extra), device)
        returned = _call(fn, s, device, f"re-verification {extra}")
        _verify(wl, s, f"re-verification {extra}", returned)
    raise _Failure(
        Status.REJECTED,
        f"measured {timing.median_ms * 1e3:.2f} us is below the memory-bandwidth floor "
        f"{floor_ms * 1e3:.2f} us ({cost['bytes'] / 1e6:.2f} MB at "
        f"{config.peak_bandwidth_gbps:.0f} GB/s): the timing cannot be real",
    )


def _feedback(results: Sequence[ShapeResult]) -> str:
    failed = [r for r in results if r.status is not Status.PASSED]
    if failed:
        first = failed[0]
        return f"{first.status.value} on shape {first.shape}: {_first_lines(first.message, 12)}"
    parts = [
        f"{r.shape[:8]}: {r.timing.median_ms * 1e3:.1f} us" for r in results if r.timing is not None
    ]
    return "all shapes passed; latency " + ", ".join(parts)


def run_candidate(
    wl: Workload, candidate: Candidate, shapes: Sequence[str], config: HarnessConfig
) -> Evaluation:
    """The whole cascade for one candidate; never raises for the candidate's faults."""
    started = perf_counter()
    device = torch.device(config.device)
    env = config.environment or fingerprint(device)
    arch = None
    if device.type == "cuda":
        arch = arch_for_capability(*torch.cuda.get_device_capability(device))

    def verdict(status: Status, feedback: str, **extra: Any) -> Evaluation:
        return Evaluation(
            candidate_id=candidate.id, status=status, feedback=feedback, environment=env,
            wall_s=perf_counter() - started, **extra,
        )

    cache = BuildCache(config.build_cache) if config.build_cache is not None else None
    if device.type == "cpu" and candidate.language is not Language.TORCH:
        if candidate.language is Language.CUDA:
            try:
                resources = check_cuda_nvcc(cuda_source(candidate), "sm_90a", cache)
            except BuildError as exc:
                return verdict(Status.BUILD_FAILED, _first_lines(str(exc)), log=str(exc))
            except (FileNotFoundError, OSError) as exc:
                return verdict(Status.SKIPPED, f"cuda candidate not built: {exc}; it needs a GPU")
            return verdict(
                Status.SKIPPED,
                "built with nvcc for sm_90a; running it needs a GPU, and this machine has none",
                resources=resources,
            )
        return verdict(
            Status.SKIPPED, "triton kernels need a GPU; this machine has none, so it was not run"
        )

    build_started = perf_counter()
    try:
        fn, resources = build_runner(
            candidate, config.scratch, arch=arch, arguments=[*wl.input_names, *wl.output_names],
            cache=cache,
        )
        resources["build_s"] = perf_counter() - build_started
    except BuildError as exc:
        return verdict(Status.BUILD_FAILED, _first_lines(str(exc)), log=str(exc))
    except Exception as exc:
        tb = traceback.format_exc()
        return verdict(Status.BUILD_FAILED, f"{type(exc).__name__}: {exc}", log=tb)

    results: list[ShapeResult] = []
    device_s = 0.0
    for shape in shapes:
        result, seconds = evaluate_shape(wl, fn, shape, config, device)
        device_s += seconds
        results.append(result)
        if result.status is not Status.PASSED:
            break  # a failure is final: spend no more device time on this candidate
    worst = min((r.status for r in results), key=lambda s: s.rank, default=Status.PASSED)
    status = Status.PASSED if all(r.status is Status.PASSED for r in results) else worst
    return verdict(
        status, _feedback(results), shapes=tuple(results), resources=resources, device_s=device_s
    )


def time_reference(wl: Workload, shapes: Sequence[str], config: HarnessConfig) -> dict[str, Timing]:
    """Latency of the workload's reference on each shape (trusted code, eager)."""
    device = torch.device(config.device)
    timing_config = TimingConfig(
        warmup=config.timing.warmup, iterations=config.timing.iterations,
        e2e_iterations=config.timing.e2e_iterations, use_graphs=False,
    )

    def reference_dps(*args: torch.Tensor) -> None:
        n = len(wl.input_names)
        for out, value in zip(args[n:], wl.reference(*args[:n]), strict=True):
            out.copy_(value)

    out = {}
    for shape in shapes:
        sets = [
            _fresh_set(wl, shape, trial_seed(config.seed, shape, t), device)
            for t in range(config.trials)
        ]
        calls = [(list(s.inputs.values()), s.outputs) for s in sets]
        timer = time_gpu if device.type == "cuda" else time_cpu
        out[shape], _ = timer(reference_dps, calls, timing_config)
        del sets, calls
    return out
