"""Building candidates: import Python sources, compile CUDA sources.

CUDA is compiled with NVRTC (through CuPy's bindings) and loaded as a module of
``extern "C"`` kernels. NVRTC compiles one kernel file in well under a second;
``torch.utils.cpp_extension`` takes 30-60 s per candidate because it builds a
host extension against torch's headers, which would make build time dominate a
search. The host side of a CUDA candidate is a Python file that launches the
kernels through :class:`CudaKernels`.

Every declared parameter reaches the CUDA sources as a ``#define``; the target
architecture comes from the device (``sm_90a`` on an H200), never a constant.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from evokernel.candidate import Candidate, Language, ParamValue
from evokernel.evaluate.build_cache import BuildCache, build_key

Runner = Callable[..., Any]


class BuildError(Exception):
    """The candidate's sources do not build; the message is the compiler's log."""


class SignatureError(BuildError):
    """The built callable cannot take the definition's inputs and outputs."""


def arch_for_capability(major: int, minor: int) -> str:
    """NVRTC/nvcc target for a compute capability; arch-specific ('a') where it exists.

    Hopper (9.0) and Blackwell datacenter parts (10.x) have instructions (wgmma,
    tcgen05) that only exist in the arch-specific target.
    """
    suffix = "a" if major in (9, 10) else ""
    return f"sm_{major}{minor}{suffix}"


def param_defines(params: Mapping[str, ParamValue]) -> list[str]:
    """``#define`` lines for the parameters: ints and bools as values, strings as flags."""
    lines = []
    for name, value in sorted(params.items()):
        if isinstance(value, bool):
            lines.append(f"#define {name} {int(value)}")
        elif isinstance(value, int):
            lines.append(f"#define {name} {value}")
        elif isinstance(value, float):
            lines.append(f"#define {name} {value!r}f")
        else:
            flag = re.sub(r"[^A-Za-z0-9_]", "_", str(value)).upper()
            lines.append(f"#define {name}_{flag} 1")
    return lines


def cuda_source_with_params(source: str, params: Mapping[str, ParamValue]) -> str:
    return "\n".join([*param_defines(params), "#line 1", source])


# -- CUDA ------------------------------------------------------------------------------


@dataclass
class KernelResources:
    registers: int
    shared_bytes: int
    local_bytes: int


def _current_stream_ptr() -> Callable[[], int]:
    """A function returning torch's current stream on the current device, as a raw pointer.

    ``torch.cuda.current_stream()`` builds a Python stream object on every call, a few
    microseconds of host time; between the launches of one call that time is a gap on
    the device, which the CUPTI span of the call (FlashInfer-Bench's figure) counts. The
    private accessors Triton's launcher uses return the pointer itself; where a build
    of torch lacks them, the public path."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    device = getattr(torch._C, "_cuda_getDevice", None)
    if raw is not None and device is not None:
        return lambda: int(raw(device()))
    return lambda: int(torch.cuda.current_stream().cuda_stream)


class _StreamHandle:
    """What CuPy's launch reads from a stream argument: its ``ptr``, nothing else."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


# CUfunction_attribute values CuPy's driver module names no constant for (cuda.h)
_REQUIRED_CLUSTER_WIDTH, _REQUIRED_CLUSTER_HEIGHT, _REQUIRED_CLUSTER_DEPTH = 11, 12, 13
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
PORTABLE_CLUSTER_SIZE = 8
"""The most CTAs a cluster may hold on sm_90 without the function opting in."""


def allow_large_clusters(function_ptr: int) -> None:
    """A kernel compiled with ``__cluster_dims__`` of more than 8 CTAs (up to 16 on an
    H100 or H200) launches only if it opts in to a non-portable cluster size; ask the
    driver once, before its first launch. Kernels without clusters are left alone."""
    from cupy.cuda import driver

    size = 1
    try:
        for attribute in (_REQUIRED_CLUSTER_WIDTH, _REQUIRED_CLUSTER_HEIGHT, _REQUIRED_CLUSTER_DEPTH):
            size *= max(1, int(driver.funcGetAttribute(attribute, function_ptr)))
    except driver.CUDADriverError:  # a driver without cluster attributes: no clusters either
        return
    if size > PORTABLE_CLUSTER_SIZE:
        driver.funcSetAttribute(function_ptr, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)


@dataclass
class CudaKernels:
    """Compiled ``extern "C"`` kernels of one candidate, launched on torch's stream.

    Host code calls ``kernels["name"](grid, block, arg, ..., shared_mem=0)``. A torch
    tensor argument is passed as its device pointer, a Python int as ``int32``, a
    float as ``float32``; NumPy scalars pass unchanged.

    A launch does as little host work as it can (no imports, no stream objects built,
    the shared-memory opt-in asked of the driver once per size): in an eager call the
    host time between two launches is device idle time that the call's span counts.
    """

    module: Any
    names: tuple[str, ...]
    _functions: dict[str, Any] = field(default_factory=dict)
    _shared_limit: dict[str, int] = field(default_factory=dict)
    _launchers: dict[str, Callable[..., None]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Callable[..., None]:
        launcher = self._launchers.get(name)
        if launcher is None:
            launcher = self._launchers[name] = self._launcher(name)
        return launcher

    def _launcher(self, name: str) -> Callable[..., None]:
        import numpy as np
        import torch
        from cupy.cuda import driver
        from cupy.cuda.function import CUIntMax

        if name not in self._functions:
            self._functions[name] = self.module.get_function(name)
        function = self._functions[name]
        stream_ptr = _current_stream_ptr()
        streams: dict[int, _StreamHandle] = {}
        # a tensor's address goes as CuPy's own 8-byte argument, which its launch takes as
        # it is (a NumPy scalar would be wrapped into one on every launch)
        pointer, int32, float32 = CUIntMax, np.int32, np.float32
        tensor = torch.Tensor

        def convert(arg: Any) -> Any:
            kind = type(arg)
            if kind is int or kind is bool:
                return int32(arg)
            if kind is float:
                return float32(arg)
            if isinstance(arg, tensor):
                return pointer(arg.data_ptr())
            return arg

        def launch(
            grid: tuple[int, ...], block: tuple[int, ...], *args: Any, shared_mem: int = 0
        ) -> None:
            limit = self._shared_limit.get(name)
            if limit is None:
                allow_large_clusters(function.ptr)
                # what the function may take without opting in: 48 KiB less its static
                # shared memory (a limit on the sum), as the driver reports it
                limit = self._shared_limit[name] = driver.funcGetAttribute(
                    driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, function.ptr
                )
            if shared_mem > limit:
                # beyond it a kernel must opt in; the module's Function (unlike a
                # RawKernel) has no property for it, so through the driver, once a size
                driver.funcSetAttribute(
                    function.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem
                )
                self._shared_limit[name] = shared_mem
            ptr = stream_ptr()
            stream = streams.get(ptr)
            if stream is None:
                stream = streams[ptr] = _StreamHandle(ptr)
            function(
                tuple(grid), tuple(block), tuple(map(convert, args)),
                shared_mem=shared_mem, stream=stream,
            )

        return launch

    def resources(self) -> dict[str, KernelResources]:
        """Registers, static shared memory and local (spill) memory of each kernel.

        Read through the driver's function attributes; a driver that does not answer
        yields no entry rather than a failed build (they inform, they do not gate).
        """
        from cupy.cuda import driver

        out = {}
        for name in self.names:
            fn = self.module.get_function(name)
            try:
                out[name] = KernelResources(
                    registers=driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS, fn.ptr),
                    shared_bytes=driver.funcGetAttribute(
                        driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn.ptr
                    ),
                    local_bytes=driver.funcGetAttribute(
                        driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn.ptr
                    ),
                )
            except (AttributeError, driver.CUDADriverError):
                continue
        return out


_KERNEL_NAME = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)')


def kernel_names(source: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_KERNEL_NAME.findall(source)))


NVRTC_OPTIONS = ("-std=c++17", "-default-device", "-lineinfo")


def compile_cuda_nvrtc(source: str, arch: str, name: str = "kernel.cu") -> bytes:
    """Compile to a cubin with NVRTC; raise BuildError with the compiler log."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(source, name, [], [])
    options = [f"-arch={arch}", *NVRTC_OPTIONS]
    try:
        nvrtc.compileProgram(prog, options)
    except nvrtc.NVRTCError as exc:
        log = nvrtc.getProgramLog(prog)
        nvrtc.destroyProgram(prog)
        raise BuildError(log.strip() or str(exc)) from exc
    try:
        return bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)


def nvrtc_cubin(source: str, arch: str, cache: BuildCache | None = None) -> tuple[bytes, dict[str, float]]:
    """NVRTC's cubin for ``source``, from the cache when this exact build was done before.

    Returns the cubin and ``build_cached`` (1 or 0); the harness times the whole build.
    A failed build is not cached: it raises every time.
    """
    key = build_key("nvrtc", nvrtc_version(), arch, *NVRTC_OPTIONS, source)
    hit = cache.load(key) if cache is not None else None
    if hit is not None:
        return hit[0], {"build_cached": 1.0}
    cubin = compile_cuda_nvrtc(source, arch)
    if cache is not None:
        cache.store(key, cubin, {"compiler": "nvrtc", "arch": arch})
    return cubin, {"build_cached": 0.0}


@functools.cache
def nvrtc_version() -> str:
    """Part of the cache key: a new NVRTC may compile the same source differently."""
    from cupy.cuda import nvrtc

    try:
        return ".".join(str(v) for v in nvrtc.getVersion())
    except Exception:  # an older binding without it: the key still has arch and source
        return "unknown"


@functools.cache
def nvcc_version(nvcc: str) -> str:
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "unknown"


def check_cuda_nvcc(source: str, arch: str, cache: BuildCache | None = None) -> dict[str, float]:
    """Compile-only check with nvcc (for machines without a GPU); returns resource usage.

    With a cache, a source checked before is not compiled again: its resource report
    comes back with ``build_cached`` 1.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    started = time.perf_counter()
    key = build_key("nvcc", nvcc_version(nvcc), arch, source)
    hit = cache.load(key) if cache is not None else None
    if hit is not None:
        return {**hit[1].get("resources", {}), "build_s": 0.0, "build_cached": 1.0}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cubin_path = Path(tmp) / "kernel.cubin"
        proc = subprocess.run(
            [nvcc, f"-arch={arch}", "-std=c++17", "-cubin", "--resource-usage",
             "-o", str(cubin_path), str(src)],
            capture_output=True, text=True, timeout=300,
        )
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise BuildError(log)
        resources = parse_resource_usage(log)
        seconds = time.perf_counter() - started
        if cache is not None:
            cache.store(key, cubin_path.read_bytes(),
                        {"compiler": "nvcc", "arch": arch, "build_s": seconds, "resources": resources})
    return {**resources, "build_s": seconds, "build_cached": 0.0}


_USAGE = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SPILL = re.compile(r"(\d+) bytes spill stores")


def parse_resource_usage(log: str) -> dict[str, float]:
    """Worst case over the kernels of ptxas' ``--resource-usage`` report."""
    regs = [int(x) for x in _USAGE.findall(log)]
    smem = [int(x) for x in _SMEM.findall(log)]
    spills = [int(x) for x in _SPILL.findall(log)]
    out: dict[str, float] = {}
    if regs:
        out["registers"] = max(regs)
    if smem:
        out["shared_bytes"] = max(smem)
    if spills:
        out["spill_bytes"] = max(spills)
    return out


def cuda_source(candidate: Candidate) -> str:
    """The one translation unit NVRTC or nvcc compiles: parameters, then every ``.cu``."""
    cu = [s for p, s in sorted(candidate.sources.items()) if p.endswith(".cu")]
    if not cu:
        raise BuildError("a cuda candidate needs at least one .cu source")
    return cuda_source_with_params("\n".join(cu), candidate.params)


def build_cuda_kernels(
    candidate: Candidate, arch: str, cache: BuildCache | None = None, cubin: bytes | None = None
) -> tuple[CudaKernels, dict[str, float]]:
    """Compile every ``.cu`` source of the candidate into one loaded module.

    ``cubin``: the binary the judge found in its build cache for exactly this source
    (built ahead); without it, NVRTC compiles here. Returns the kernels and whether
    the binary was built ahead or cached (``build_cached``).
    """
    import cupy

    source = cuda_source(candidate)
    names = kernel_names(source)
    if not names:
        raise BuildError('no extern "C" __global__ kernel found in the .cu sources')
    if cubin is not None:
        facts = {"build_cached": 1.0}
    else:
        cubin, facts = nvrtc_cubin(source, arch, cache)
    module = cupy.cuda.function.Module()
    module.load(cubin)
    return CudaKernels(module=module, names=names), facts


# -- Python ----------------------------------------------------------------------------


def import_sources(candidate: Candidate, directory: Path) -> ModuleType:
    """Write the sources to ``directory`` as a package and import the entry file.

    Triton needs kernels defined in real files, and intra-candidate imports work
    because the files sit together in one package.
    """
    package = f"evk_candidate_{candidate.id}"
    root = directory / package
    root.mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text("")
    for rel, content in candidate.sources.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    entry_file = candidate.entry_point.split("::")[0]
    module_name = f"{package}." + entry_file[:-3].replace("/", ".")
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    spec = importlib.util.spec_from_file_location(module_name, root / entry_file)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot import {entry_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise BuildError(f"{entry_file}:{exc.lineno}: {exc.msg}") from exc
    except Exception as exc:
        raise BuildError(f"importing {entry_file} failed: {type(exc).__name__}: {exc}") from exc
    return module


def check_signature(runner: Runner, arguments: Sequence[str]) -> None:
    """Raise SignatureError unless ``runner(*arguments)`` binds."""
    try:
        signature = inspect.signature(runner)
    except (TypeError, ValueError):
        return  # builtins and C extensions: nothing to inspect
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        raise SignatureError(
            f"signature: the callable takes {signature}, but is called with "
            f"({', '.join(arguments)}): {exc}"
        ) from exc


def build_runner(
    candidate: Candidate,
    directory: Path,
    *,
    arch: str | None,
    arguments: Sequence[str],
    cache: BuildCache | None = None,
    cubin: bytes | None = None,
) -> tuple[Runner, dict[str, float]]:
    """Build a candidate into its DPS callable and the resource facts of its build.

    ``arguments`` are the definition's input then output names: the callable must
    accept them positionally.
    """
    started = time.perf_counter()
    resources: dict[str, float] = {}
    kernels: CudaKernels | None = None
    if candidate.language is Language.CUDA:
        if arch is None:
            raise BuildError("no target architecture for a cuda candidate")
        kernels, resources = build_cuda_kernels(candidate, arch, cache, cubin)
        per_kernel = kernels.resources()
        if per_kernel:
            resources |= {
                "registers": max(r.registers for r in per_kernel.values()),
                "shared_bytes": max(r.shared_bytes for r in per_kernel.values()),
                "local_bytes": max(r.local_bytes for r in per_kernel.values()),
            }
    module = import_sources(candidate, directory)
    symbol = candidate.entry_point.split("::")[1]
    factory = getattr(module, symbol, None)
    if not callable(factory):
        raise BuildError(f"entry point {candidate.entry_point} is not a callable in its file")
    try:
        runner = factory(dict(candidate.params), kernels)
    except Exception as exc:
        raise BuildError(f"{candidate.entry_point} raised {type(exc).__name__}: {exc}") from exc
    if not callable(runner):
        raise BuildError(f"{candidate.entry_point} returned {type(runner).__name__}, not a callable")
    check_signature(runner, arguments)
    resources["build_s"] = time.perf_counter() - started
    return runner, resources
