"""launch_cost's baseline launches what CudaKernels launches: the comparison is of paths only."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import torch

from benchmarks import launch_cost
from evokernel.evaluate import build

pytest.importorskip("cupy")


class RecordingFunction:
    ptr = 99

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                 shared_mem: int = 0, stream: Any = None) -> None:
        self.launches.append((grid, block, [value_of(a) for a in args], shared_mem, stream.ptr))


def value_of(arg: Any) -> tuple[int, float | int]:
    """(bytes, value) of a launch argument as the kernel receives it."""
    from cupy.cuda.function import CUIntMax

    if isinstance(arg, CUIntMax):
        return 8, ctypes.c_uint64.from_address(arg.ptr).value
    return arg.itemsize, arg.item()


class OneFunction:
    def __init__(self, function: RecordingFunction) -> None:
        self.function = function

    def get_function(self, name: str) -> RecordingFunction:
        return self.function


def test_the_legacy_path_and_cudakernels_launch_the_same_arguments_on_the_same_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cupy
    from cupy.cuda import driver

    # 48 KiB of shared memory without an opt-in; no cluster dimensions compiled in
    monkeypatch.setattr(driver, "funcGetAttribute",
                        lambda attr, f: 48 * 1024 if attr == driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES else 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"cuda_stream": 0xC0})())
    monkeypatch.setattr(cupy.cuda, "ExternalStream", lambda ptr: type("E", (), {"ptr": ptr})())
    monkeypatch.setattr(build, "_current_stream_ptr", lambda: lambda: 0xC0)
    tensor = torch.arange(3, dtype=torch.float32)
    args = (tensor, 5, True, 0.25)
    legacy, current = RecordingFunction(), RecordingFunction()
    launch_cost.legacy_launcher(legacy, {})((4,), (32,), *args, shared_mem=128)
    build.CudaKernels(module=OneFunction(current), names=("mark",))["mark"]((4,), (32,), *args,
                                                                            shared_mem=128)
    assert legacy.launches == current.launches
    assert current.launches[0][2] == [(8, tensor.data_ptr()), (4, 5), (4, 1), (4, 0.25)]
