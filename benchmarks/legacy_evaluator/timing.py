"""Timing a callable the way the benchmark does, plus what the benchmark misses.

On a GPU, each candidate call is captured once per input set into a CUDA graph and
the graph replays are timed with CUDA events. A replay is one launch from the
host, so the time is the GPU's (kernels and the gaps between them), not the
Python harness's launch overhead; FlashInfer-Bench gets the same effect from
CUPTI's kernel span. CUPTI would need ``cupti-python`` carried to the device, and
graphs need nothing. A callable that cannot be captured (a host sync, a
data-dependent launch) is timed eagerly with events instead and says so in
``Timing.method``: each call is then timed from the host between device-wide
synchronisations, so work hidden on a side stream still counts. End-to-end host
time of an eager call is recorded beside it.

Every timed call is preceded, outside the timed region, by an L2 flush (writing a
buffer of twice the L2 size) and by poisoning the outputs, and the calls rotate
over several input sets so that no result can be served from a cache; the caller
re-checks what the timed calls wrote.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evokernel.evaluate.result import Timing

POISON_INT = -123456789
POISON_FLOAT = float("nan")

# Bound when the worker starts, before any candidate is imported: a candidate that
# patches these names later changes nothing the harness calls.
_perf_counter = time.perf_counter
perf_counter = _perf_counter
"""The harness's clock: bound before candidates load, so patching ``time`` changes nothing."""
_synchronize = torch.cuda.synchronize
_elapsed_time = torch.cuda.Event.elapsed_time
_Event = torch.cuda.Event


@dataclass
class TimingConfig:
    warmup: int = 10
    iterations: int = 50
    e2e_iterations: int = 10
    use_graphs: bool = True


def poison(outputs: Sequence[torch.Tensor]) -> None:
    """Fill outputs with values no correct kernel leaves behind."""
    for out in outputs:
        if out.is_floating_point():
            out.fill_(POISON_FLOAT)
        elif out.dtype == torch.bool:
            out.fill_(True)
        else:
            out.fill_(POISON_INT if out.element_size() >= 4 else -1 - (1 << (8 * out.element_size() - 2)))


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice its size."""

    def __init__(self, device: torch.device) -> None:
        props = torch.cuda.get_device_properties(device)
        size = max(int(getattr(props, "L2_cache_size", 0)) * 2, 64 << 20)
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def _summary(samples_ms: Sequence[float], e2e_ms: Sequence[float], method: str) -> Timing:
    ordered = sorted(samples_ms)
    q = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return Timing(
        median_ms=max(statistics.median(ordered), 1e-6),
        p25_ms=q[0],
        p75_ms=q[2],
        e2e_ms=max(statistics.median(e2e_ms), 1e-6),
        samples=len(ordered),
        method=method,
    )


Call = tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]
"""(inputs in signature order, outputs) of one input set."""


def _capture(fn: Callable[..., Any], inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up on a side stream, as capture requires
            fn(*inputs, *outputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*inputs, *outputs)
    torch.cuda.synchronize()
    return graph


Launch = Callable[[int], None]
"""Calls the timed callable on input set i the way it was timed (graph or eager)."""


def time_gpu(
    fn: Callable[..., Any], calls: Sequence[Call], config: TimingConfig
) -> tuple[Timing, Launch]:
    """GPU time of ``fn`` over rotating input sets.

    Afterwards each set's outputs hold what one timed launch wrote, for the re-check.
    """
    device = calls[0][1][0].device
    flush = L2Flusher(device)
    graphs: list[Any] | None = None
    if config.use_graphs:
        try:
            graphs = [_capture(fn, inp, out) for inp, out in calls]
        except Exception:
            graphs = None
            torch.cuda.synchronize()

    def launch(i: int) -> None:
        if graphs is not None:
            graphs[i].replay()
        else:
            inp, out = calls[i]
            fn(*inp, *out)

    n = len(calls)
    for i in range(config.warmup):
        launch(i % n)
    torch.cuda.synchronize()

    def e2e_once(i: int) -> float:
        inp, out = calls[i % n]
        flush()
        poison(out)
        _synchronize()
        t0 = _perf_counter()
        fn(*inp, *out)
        _synchronize()  # the whole device: work hidden on a side stream is counted
        return (_perf_counter() - t0) * 1e3

    if graphs is not None:
        # Events around one replay measure the GPU work of the graph, whatever streams
        # it forks internally; work outside the graph is not replayed at all, and the
        # re-check of the outputs catches it.
        starts = [_Event(enable_timing=True) for _ in range(config.iterations)]
        ends = [_Event(enable_timing=True) for _ in range(config.iterations)]
        for i in range(config.iterations):
            flush()
            poison(calls[i % n][1])
            starts[i].record()
            launch(i % n)
            ends[i].record()
        _synchronize()
        samples = [_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True)]
        method = "cuda-graph"
    else:
        # Not capturable: time each call from the host between device-wide syncs,
        # launch overhead included (events on one stream would miss side streams).
        samples = [e2e_once(i) for i in range(config.iterations)]
        method = "cuda-sync-wallclock"
    e2e = [e2e_once(i) for i in range(config.e2e_iterations)]
    # Leave every set's outputs as written by a timed launch, for the re-check.
    for i in range(n):
        poison(calls[i][1])
        launch(i)
    _synchronize()
    return _summary(samples, e2e, method), launch


def time_cpu(
    fn: Callable[..., Any], calls: Sequence[Call], config: TimingConfig
) -> tuple[Timing, Launch]:
    """Wall-clock time on the CPU (no cache flush: CPU numbers rank, they do not report)."""
    n = len(calls)
    for i in range(min(config.warmup, 2)):
        inp, out = calls[i % n]
        fn(*inp, *out)
    samples = []
    for i in range(config.iterations):
        inp, out = calls[i % n]
        poison(out)
        t0 = _perf_counter()
        fn(*inp, *out)
        samples.append((_perf_counter() - t0) * 1e3)
    def launch(i: int) -> None:
        inp, out = calls[i]
        fn(*inp, *out)

    for i, (_, out) in enumerate(calls):
        poison(out)
        launch(i)
    return _summary(samples, samples, "cpu-wallclock"), launch
