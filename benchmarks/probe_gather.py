"""How fast can the GPU read what a dsa_sparse_attention call must read? (GPU, trusted)

    python benchmarks/probe_gather.py [--shapes quick] [--spans 16,32,64,128,256] [--calls 10]

Issue 14 asks for a mean of 10 us and at most 2x (gathered bytes over bandwidth + 3 us)
on every shape; the seeds measure 12 us at one or two tokens and 19-20 us at eight on an
H200 (2026-12-07). This probe times the parts of that work with nothing else around
them (benchmarks/gather_floor.cu): an empty launch of the grid, the slot ids alone, the
spread merge's grid-wide wait alone (one acq_rel add and a poll a CTA), and the rows
gathered three ways (16-byte loads into registers, cp.async into shared memory,
bulk copies), for each shape's real inputs and several span lengths (slots a CTA: the
grid is tokens x 2048/span). Each figure is the median CUPTI span of one call on a cold
L2, as the judge times kernels; beside it the bytes read, the rate, and the issue's
floor (gathered bytes over the measured copy bandwidth, plus 3 us).

What it tells: the fastest any kernel of this form can gather, so how much of a seed's
time is the gathers and how much the rest (logits, softmax, merge, their waits); and
whether the issue's target is within reach on this GPU at all. Not a result for the
README's tables: only the judge's figures are those.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from evokernel.workload import load_workload

KERNELS = Path(__file__).resolve().parent / "gather_floor.cu"
THREADS = 256
PIECES = 72
ROW_BYTES = PIECES * 16
"""1024 latent bytes and 128 rotary bytes a gathered row."""
MAX_RESIDENT_SPAN = 128
"""gather_async and gather_bulk hold a span's rows in shared memory: 128 x 1152 B."""
METHODS = ("launch_only", "slots_only", "wait_only", "gather_ldg", "gather_async", "gather_bulk")
WAIT_MAX_CTAS = 264
"""wait_only's grid must be resident at once: at most this many CTAs (two an SM of a
132-SM device; its CTAs hold 8 KB of shared memory and 256 threads)."""
FLOOR_EXTRA_US = 3.0
"""The fixed part of issue 14's floor (gathered bytes over bandwidth + 3 us)."""


RESIDENT = ("launch_only", "gather_async", "gather_bulk")
"""Kernels given a resident CTA's dynamic shared memory: 16 bytes (the mbarrier or the
fold) and the span's rows."""


def spans_for(method: str, spans: Sequence[int], topk: int, tokens: int = 1) -> list[int]:
    """The span lengths a method is timed at: those dividing topk; for the kernels with a
    resident CTA's shared memory, at most MAX_RESIDENT_SPAN; for wait_only, those giving a
    power of two of spans a token and at most WAIT_MAX_CTAS CTAs."""
    usable = [s for s in spans if 0 < s <= topk and topk % s == 0]
    if method in RESIDENT:
        usable = [s for s in usable if s <= MAX_RESIDENT_SPAN]
    if method == "wait_only":  # a power of two of spans, all resident at once
        usable = [s for s in usable if (topk // s) & (topk // s - 1) == 0 and tokens * (topk // s) <= WAIT_MAX_CTAS]
    return usable


def dynamic_shared(method: str, span: int) -> int:
    return 16 + span * ROW_BYTES if method in RESIDENT else 0


def gathered_bytes(indices: torch.Tensor) -> int:
    """Bytes of the rows the call must read: every non-negative slot id, one row each."""
    return int((indices >= 0).sum().item()) * ROW_BYTES


def floor_us(nbytes: int, bandwidth_gbps: float) -> float:
    return nbytes / (bandwidth_gbps * 1e3) + FLOOR_EXTRA_US


def grid_of(indices: torch.Tensor, span: int) -> tuple[int, int, int]:
    tokens, topk = indices.shape
    return (tokens, topk // span, 1)


def launch(kernels: Any, method: str, inputs: dict[str, torch.Tensor], span: int, sink: torch.Tensor,
           counters: torch.Tensor | None = None) -> None:
    """One call of ``method`` over the inputs' index rows in spans of ``span`` slots;
    ``sink`` takes a word per CTA (at least tokens x topk/span of them); wait_only also
    takes ``counters``, an int32 a token, zero before the first call and left by every
    call a multiple of its EPOCH (1024)."""
    indices = inputs["sparse_indices"]
    topk = indices.shape[1]
    if method == "launch_only":
        arguments: tuple[Any, ...] = (sink,)
    elif method == "slots_only":
        arguments = (indices, topk, span, sink)
    elif method == "wait_only":
        if counters is None:
            raise ValueError("wait_only needs counters")
        arguments = (indices, topk, span, counters, sink)
    else:
        arguments = (inputs["ckv_cache"], inputs["kpe_cache"], indices, topk, span, sink)
    kernels[method](grid_of(indices, span), (THREADS, 1, 1), *arguments, shared_mem=dynamic_shared(method, span))


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per method and span: the mean over shapes of the CUPTI span (and over how many);
    per method, the best such mean among the spans timed on every shape the probe ran
    (the figure a kernel of that form could reach on these shapes: a span timed on the
    small shapes only, as wait_only's short ones are, is not compared with the others),
    and the mean over shapes of each shape's best span (a kernel choosing its span by
    shape)."""
    metrics: dict[str, Any] = {}
    shapes = {r["shape"] for r in rows}
    by: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r["cupti_us"] is not None:
            by.setdefault((r["method"], r["span"]), {})[r["shape"]] = r["cupti_us"]
    for (method, span), values in by.items():
        metrics[f"gather.{method}.span{span}.mean_cupti_us"] = statistics.fmean(values.values())
        metrics[f"gather.{method}.span{span}.shapes"] = len(values)
    for method in METHODS:
        complete = [(statistics.fmean(v.values()), s) for (m, s), v in by.items()
                    if m == method and set(v) == shapes]
        if complete:
            mean, span = min(complete)
            metrics[f"gather.{method}.best_span"] = span
            metrics[f"gather.{method}.best_mean_cupti_us"] = mean
        per_shape = [min(v[shape] for (m, _), v in by.items() if m == method and shape in v)
                     for shape in shapes if any(m == method and shape in v for (m, _), v in by.items())]
        if per_shape:
            metrics[f"gather.{method}.best_span_per_shape_mean_cupti_us"] = statistics.fmean(per_shape)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="quick", help="a subset, or shape ids, comma-separated")
    parser.add_argument("--spans", default="16,32,64,128,256",
                        help="slots a CTA, comma-separated (each must divide topk)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"--methods: unknown {sorted(unknown)}; known: {', '.join(METHODS)}")
    spans = [int(s) for s in args.spans.split(",") if s]
    if not torch.cuda.is_available():
        raise SystemExit("probe_gather needs a CUDA device")

    import cupy

    from benchmarks.attn_gpu_check import measure_bandwidth_gbps
    from benchmarks.record import write_result
    from evokernel.evaluate.build import (
        CudaKernels,
        arch_for_capability,
        compile_cuda_nvrtc,
        kernel_names,
    )
    from evokernel.evaluate.environment import fingerprint
    from evokernel.evaluate.timing import CuptiSpans, L2Flusher

    device = torch.device("cuda")
    workload = load_workload("dsa_sparse_attention")
    source = KERNELS.read_text()
    module = cupy.cuda.function.Module()
    module.load(compile_cuda_nvrtc(source, arch_for_capability(*torch.cuda.get_device_capability())))
    kernels = CudaKernels(module=module, names=kernel_names(source))
    bandwidth = measure_bandwidth_gbps(device)
    print(f"measured copy bandwidth: {bandwidth:.0f} GB/s", flush=True)
    flush = L2Flusher(device)
    cupti = CuptiSpans()
    if not cupti.available:
        raise SystemExit(cupti.why_not)
    sink = torch.zeros(1 << 16, dtype=torch.int32, device=device)  # a word a CTA
    rows: list[dict[str, Any]] = []
    for shape in workload.resolve_shapes(args.shapes):
        inputs = workload.make_inputs(shape, 0, device)
        indices = inputs["sparse_indices"]
        tokens, topk = indices.shape
        nbytes = gathered_bytes(indices)
        floor = floor_us(nbytes, bandwidth)
        counters = torch.zeros(tokens, dtype=torch.int32, device=device)  # wait_only: one a token
        print(f"{shape[:8]} tokens {tokens}: {nbytes / 1e6:.2f} MB gathered, floor {floor:.2f} us", flush=True)
        for method in methods:
            for span in spans_for(method, spans, topk, tokens):
                grid = grid_of(indices, span)

                def call(method: str = method, inputs: dict[str, torch.Tensor] = inputs, span: int = span,
                         counters: torch.Tensor = counters) -> None:
                    launch(kernels, method, inputs, span, sink, counters)

                call()
                torch.cuda.synchronize()
                got = [s for s in cupti.measure([call] * args.calls, flush) if s]
                us = statistics.median(got) * 1e3 if got else None
                moved = nbytes if method.startswith("gather") else 0
                rows.append({"shape": shape, "tokens": tokens, "method": method, "span": span,
                             "ctas": grid[0] * grid[1], "cupti_us": us, "bytes": moved,
                             "gbps": moved / (us * 1e3) if us and moved else None,
                             "floor_us": floor, "over_floor": us / floor if us else None})
                rate = f", {rows[-1]['gbps']:.0f} GB/s" if rows[-1]["gbps"] else ""
                print(f"  {method:13s} span {span:4d} ({grid[0] * grid[1]:4d} CTAs): "
                      f"{us if us is None else round(us, 2)} us{rate}", flush=True)
        del inputs, indices
    metrics = {"gather.bandwidth_gbps": bandwidth, **summarise(rows)}
    for key, value in metrics.items():
        print(f"{key} = {value}")
    print(f"wrote {write_result('probe-gather-dsa_sparse_attention', metrics, fingerprint(device), rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
