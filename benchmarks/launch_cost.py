"""What a CUDA candidate's kernel launch costs on the host, and the idle gap it leaves in a call.

    python benchmarks/launch_cost.py [--launches 2000] [--calls 200]      # on a GPU

A CUDA candidate's host code launches its kernels through ``CudaKernels``. In an eager
call of two launches the second kernel cannot start before the host has issued it, so
the host time of a launch is idle device time inside the call, and the CUPTI span of
the call (FlashInfer-Bench's figure, the one the issues' done-whens name) counts it:
cuda_radix's scoring shapes took 24-47 us that way on an H200 while their kernels
replayed in a graph took 12.6-29 us.

Side by side in one run, three ways to launch the same compiled kernel (ten arguments,
as cuda_radix's select passes):

* ``legacy``: the launch path before this benchmark (commit 5f5ab8d), reproduced here as
  the baseline: imports, a torch stream object and a CuPy ``ExternalStream`` built on
  every launch;
* ``current``: ``CudaKernels`` as the judge builds it;
* ``cupy_direct``: CuPy's ``Function`` called with arguments converted and a stream made
  beforehand, the least any launcher through CuPy can cost.

Per way: host microseconds per launch (median of ``--rounds`` rounds of ``--launches``
launches, the device synced between rounds) and the CUPTI span of a two-launch call
(median of ``--calls`` calls, each between syncs). Ratios are legacy over current.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.record import write_result
from evokernel.evaluate.build import CudaKernels, arch_for_capability, nvrtc_cubin
from evokernel.evaluate.environment import fingerprint
from evokernel.evaluate.timing import CuptiSpans

SOURCE = r"""
extern "C" __global__ void mark(const float* a, const float* b, const float* c,
                                const int* d, int* e, int* out,
                                int n, int m, int k, int v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = v + n + m + k + (a == b) + (c == nullptr)
                                                    + (d == nullptr) + (e == nullptr);
}
"""


def legacy_launcher(function: Any, shared_limit: dict[str, int]) -> Callable[..., None]:
    """The launch closure of CudaKernels at commit 5f5ab8d, unchanged but for its name."""

    def launch(grid: tuple[int, ...], block: tuple[int, ...], *args: Any, shared_mem: int = 0) -> None:
        import cupy
        import numpy as np
        import torch

        converted: list[Any] = []
        for arg in args:
            if isinstance(arg, torch.Tensor):
                converted.append(np.uint64(arg.data_ptr()))
            elif isinstance(arg, bool):
                converted.append(np.int32(int(arg)))
            elif isinstance(arg, int):
                converted.append(np.int32(arg))
            elif isinstance(arg, float):
                converted.append(np.float32(arg))
            else:
                converted.append(arg)
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        from cupy.cuda import driver

        if "mark" not in shared_limit:
            shared_limit["mark"] = driver.funcGetAttribute(
                driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, function.ptr)
        function(tuple(grid), tuple(block), tuple(converted), shared_mem=shared_mem, stream=stream)

    return launch


def direct_launcher(function: Any, args: tuple[Any, ...]) -> Callable[..., None]:
    import cupy
    import numpy as np

    converted = tuple(np.uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else np.int32(a)
                      for a in args)
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def launch(grid: tuple[int, ...], block: tuple[int, ...], *_: Any, shared_mem: int = 0) -> None:
        function(grid, block, converted, shared_mem=shared_mem, stream=stream)

    return launch


def host_us_per_launch(launch: Callable[..., None], args: tuple[Any, ...], launches: int,
                       rounds: int) -> list[float]:
    figures = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(launches):
            launch((1,), (32,), *args)
        figures.append((time.perf_counter() - t0) / launches * 1e6)
        torch.cuda.synchronize()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    import cupy

    device = torch.device("cuda")
    arch = arch_for_capability(*torch.cuda.get_device_capability())
    cubin, _ = nvrtc_cubin(SOURCE, arch)
    module = cupy.cuda.function.Module()
    module.load(cubin)
    kernels = CudaKernels(module=module, names=("mark",))
    f32 = torch.zeros(16, device=device)
    i32 = torch.zeros(16, device=device, dtype=torch.int32)
    out = torch.zeros(1, device=device, dtype=torch.int32)
    kernel_args = (f32, f32, f32, i32, i32, out, 3, 4, 5, 6)
    ways: dict[str, Callable[..., None]] = {
        "legacy": legacy_launcher(module.get_function("mark"), {}),
        "current": kernels["mark"],
        "cupy_direct": direct_launcher(module.get_function("mark"), kernel_args),
    }
    for launch in ways.values():  # each way's first launch (driver queries) untimed
        launch((1,), (32,), *kernel_args)
    torch.cuda.synchronize()
    if int(out.item()) != 6 + 3 + 4 + 5 + 1:
        raise SystemExit(f"the probe kernel wrote {int(out.item())}: its arguments did not arrive")

    spans = CuptiSpans()
    rows: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {"launch.launches": args.launches, "launch.calls": args.calls}
    # interleaved rounds: a slow moment of the host falls on every way alike
    host: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, launch in ways.items():
            host[name] += host_us_per_launch(launch, kernel_args, args.launches, 1)
    for name, launch in ways.items():
        median_host = statistics.median(host[name])
        metrics[f"launch.{name}.host_us_median"] = median_host
        rows += [{"way": name, "figure": "host_us_per_launch", "value": v} for v in host[name]]
        if spans.available:
            def call(launch: Callable[..., None] = launch) -> None:
                launch((1,), (32,), *kernel_args)
                launch((1,), (32,), *kernel_args)

            figures = [s for s in spans.measure([call] * args.calls, lambda: None) if s is not None]
            span_us = statistics.median(figures) * 1e3
            metrics[f"launch.{name}.two_launch_span_us_median"] = span_us
            rows += [{"way": name, "figure": "two_launch_span_us", "value": s * 1e3} for s in figures]
        print(f"{name:12s} host {median_host:7.2f} us a launch"
              + (f", two-launch call span {metrics[f'launch.{name}.two_launch_span_us_median']:7.2f} us"
                 if spans.available else f" ({spans.why_not})"), flush=True)
    metrics["launch.host_ratio_legacy_over_current"] = (
        metrics["launch.legacy.host_us_median"] / metrics["launch.current.host_us_median"])
    if spans.available:
        metrics["launch.span_ratio_legacy_over_current"] = (
            metrics["launch.legacy.two_launch_span_us_median"]
            / metrics["launch.current.two_launch_span_us_median"])
    for key, value in metrics.items():
        print(f"{key} = {value}")
    path = write_result("launch-cost", metrics, fingerprint(device), rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
