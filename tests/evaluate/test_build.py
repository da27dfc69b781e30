"""CudaKernels' launch path, with a fake compiled module (no GPU needed)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import torch

from evokernel.evaluate import build
from evokernel.evaluate.build import CudaKernels

cupy = pytest.importorskip("cupy")


class FakeFunction:
    ptr = 1234

    def __init__(self) -> None:
        self.launches: list[dict[str, Any]] = []

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], **kw: Any) -> None:
        self.launches.append({"grid": grid, "block": block, "args": args, **kw})


class FakeModule:
    def __init__(self) -> None:
        self.function = FakeFunction()

    def get_function(self, name: str) -> FakeFunction:
        return self.function


@pytest.fixture
def driver_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    from cupy.cuda import driver

    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(driver, "funcSetAttribute", lambda f, attr, value: calls.append((f, attr, value)))
    # the driver's limit before any opt-in: 48 KiB less the kernel's 160 bytes of static
    # memory; no cluster dimensions compiled in (0)
    static = 160
    monkeypatch.setattr(driver, "funcGetAttribute",
                        lambda attr, f: 48 * 1024 - static if attr == driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                        else 0)
    streams = iter([0xA0, 0xA0, 0xB0])
    monkeypatch.setattr(build, "_current_stream_ptr", lambda: lambda: next(streams, 0xA0))
    return calls


def test_large_dynamic_shared_memory_is_opted_in_through_the_driver_once_per_size(
    driver_calls: list[tuple[int, int, int]],
) -> None:
    from cupy.cuda import driver

    kernels = CudaKernels(module=FakeModule(), names=("k",))
    launch = kernels["k"]
    launch((1,), (32,), 3, 2.5, True, shared_mem=16 * 1024)
    assert driver_calls == []  # under 48 KiB needs no opt-in
    launch((1,), (32,), shared_mem=100 * 1024)
    launch((1,), (32,), shared_mem=100 * 1024)
    launch((1,), (32,), shared_mem=90 * 1024)
    launch((1,), (32,), shared_mem=200 * 1024)
    attr = driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert driver_calls == [(1234, attr, 100 * 1024), (1234, attr, 200 * 1024)]
    first = kernels.module.function.launches[0]
    assert [type(a).__name__ for a in first["args"]] == ["int32", "float32", "int32"]
    assert [launch["shared_mem"] for launch in kernels.module.function.launches] == [
        16 * 1024, 100 * 1024, 100 * 1024, 90 * 1024, 200 * 1024
    ]


def test_a_launch_just_under_48_kib_is_opted_in_when_static_memory_takes_it_over(
    driver_calls: list[tuple[int, int, int]],
) -> None:
    # found on the H200: 49,040 dynamic bytes beside 160 static ones were refused
    from cupy.cuda import driver

    kernels = CudaKernels(module=FakeModule(), names=("k",))
    kernels["k"]((1,), (32,), shared_mem=48 * 1024 - 160)
    assert driver_calls == []
    kernels["k"]((1,), (32,), shared_mem=49_040)
    assert driver_calls == [(1234, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 49_040)]


def test_a_launch_goes_on_torchs_current_stream_with_converted_arguments(
    driver_calls: list[tuple[int, int, int]],
) -> None:
    kernels = CudaKernels(module=FakeModule(), names=("k",))
    launch = kernels["k"]
    assert kernels["k"] is launch  # one launcher a kernel, built once
    tensor = torch.zeros(4)
    launch((2, 1), (64,), tensor, 7, True, 0.5, shared_mem=0)
    launch((2, 1), (64,), tensor, shared_mem=0)
    launch((2, 1), (64,), tensor, shared_mem=0)
    launches = kernels.module.function.launches
    # the stream torch had current at each launch, by its raw pointer; one handle a stream
    assert [call["stream"].ptr for call in launches] == [0xA0, 0xA0, 0xB0]
    assert launches[0]["stream"] is launches[1]["stream"]
    args = launches[0]["args"]
    assert [type(a).__name__ for a in args] == ["CUIntMax", "int32", "int32", "float32"]
    # the 8 bytes CuPy passes for the tensor are its address
    assert ctypes.c_uint64.from_address(args[0].ptr).value == tensor.data_ptr()
    assert int(args[1]) == 7 and int(args[2]) == 1 and float(args[3]) == 0.5


@pytest.mark.parametrize(("width", "opted_in"), [(16, True), (8, False), (0, False)])
def test_a_cluster_of_more_than_8_ctas_opts_in_to_a_non_portable_size_once(
    monkeypatch: pytest.MonkeyPatch, width: int, opted_in: bool,
) -> None:
    """``__cluster_dims__(16, 1, 1)`` launches on sm_90 only with the function's
    non-portable cluster size allowed: asked of the driver before the first launch, once;
    a portable cluster, or none, asks nothing."""
    from cupy.cuda import driver

    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(driver, "funcSetAttribute", lambda f, attr, value: calls.append((f, attr, value)))
    widths = {build._REQUIRED_CLUSTER_WIDTH: width, build._REQUIRED_CLUSTER_HEIGHT: 1 if width else 0,
              build._REQUIRED_CLUSTER_DEPTH: 1 if width else 0}
    monkeypatch.setattr(driver, "funcGetAttribute",
                        lambda attr, f: widths.get(attr, 48 * 1024))
    monkeypatch.setattr(build, "_current_stream_ptr", lambda: lambda: 0xA0)
    kernels = CudaKernels(module=FakeModule(), names=("k",))
    for _ in range(3):
        kernels["k"]((16, 8), (256,), shared_mem=1024)
    assert calls == ([(1234, build._NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)] if opted_in else [])
    assert len(kernels.module.function.launches) == 3
