"""Run a seed's CUDA kernels on the CPU, for correctness tests without a GPU.

``emulate(source, params, directory)`` compiles a ``.cu`` file's kernels with g++ against
``emu.h`` (see its header for what the emulation is and is not) and returns an object
used exactly like the judge's compiled kernels (``CudaKernels`` in
evokernel/evaluate/build.py): ``kernels[name](grid, block, *args, shared_mem=0)``, with
CPU tensors passed as pointers, Python ints as int32 and floats as float32. A fault in a
kernel (``__trap()``, a shared-memory access outside the launch's allocation, an
unaligned async copy) raises ``EmulationFault``.

The kernel file must keep its inline PTX in helpers under ``#ifndef
EVOKERNEL_EMULATION`` (emu.h supplies them); any other ``asm`` fails to compile here.
The translation unit rewrites three kinds of declaration for the emulation: dynamic shared
memory (``extern __shared__ T name[];``, at file or function scope) becomes a per-thread
pointer to the running block's allocation, each static ``__shared__`` variable a reference
to the running block's own instance (blocks of a cluster run at once), and a kernel
declaration with ``__cluster_dims__(x, y, z)`` registers its cluster shape, so that its
launches run each cluster's blocks together.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from evokernel.evaluate.build import cuda_source_with_params, kernel_names

HERE = Path(__file__).resolve().parent
_DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+__align__\((\d+)\)\s+(\w+(?:\s+\w+)*?)\s+(\w+)\[\];")
_STATIC_SHARED = re.compile(  # on one line
    r"__shared__[ \t]+(?:__align__\([ \t]*(\d+)[ \t]*\)[ \t]+)?([A-Za-z_][\w:]*(?:[ \t]*<[^;<>\n]*>)?)"
    r"[ \t]+([^;=(){}\n]+?)[ \t]*;")
_DECLARATOR = re.compile(r"\s*(\w+)\s*((?:\[[^\]]+\])*)\s*")
_CLUSTER_DIMS = re.compile(r"__cluster_dims__\s*\(([^)]*)\)\s*(\w+)\s*\(([^;{}]*)\)\s*;")
DYNAMIC_BASE_ALIGN = 128
"""emu.h's dynamic_base: the alignment the emulation gives dynamic shared memory."""


class EmulationFault(RuntimeError):
    """A kernel trapped or touched memory it must not, under emulation."""


def available() -> bool:
    return shutil.which("g++") is not None


def _dynamic_shared(match: re.Match[str]) -> str:
    align, kind, name = match.groups()
    if int(align) > DYNAMIC_BASE_ALIGN:
        raise ValueError(f"extern __shared__ {name}: the emulation aligns dynamic shared memory to "
                         f"{DYNAMIC_BASE_ALIGN} bytes, not {align}")
    # a thread runs one block, so a thread_local pointer is the block's (at any scope)
    return f"static thread_local {kind}* {name} = static_cast<{kind}*>(emu::dynamic_shared());"


def _static_shared(match: re.Match[str], keys: list[int]) -> str:
    align, kind, declarators = match.groups()
    line = match.string[match.string.rfind("\n", 0, match.start()) + 1:match.start()]
    parts = [_DECLARATOR.fullmatch(d) for d in declarators.split(",")]
    if "//" in line or not all(parts):  # a comment; pointers, initialisers: `#define __shared__ static`
        return match.group(0)
    out = []
    for part in parts:
        assert part is not None
        name, dims = part.groups()
        keys.append(len(keys))
        out.append(f"auto& {name} = emu::block_static<{kind}{dims}, {keys[-1]}, {align or 16}>();")
    return " ".join(out)


def _cluster_dims(match: re.Match[str]) -> str:
    dims, name, params = match.groups()
    return (f"{name}({params}); static const bool emu_cluster_{name} = "
            f"emu::declare_cluster(reinterpret_cast<const void*>(&{name}), emu::cluster_dims({dims}));")


def translation_unit(source: str, params: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The C++ file g++ compiles: emu.h, the parameters' #defines, the kernels (their
    shared-memory and cluster declarations rewritten), and one ``emu_launch_<kernel>``
    entry point per kernel."""
    keys: list[int] = []
    text = _DYNAMIC_SHARED.sub(_dynamic_shared, cuda_source_with_params(source, params))
    text = _STATIC_SHARED.sub(lambda m: _static_shared(m, keys), text)
    text = _CLUSTER_DIMS.sub(_cluster_dims, text)
    if "__cluster_dims__" in re.sub(r"//[^\n]*", "", text):
        raise ValueError("__cluster_dims__ is emulated on a declaration of its own only "
                         "(`__global__ void __cluster_dims__(x, y, z) name(params);`)")
    names = kernel_names(text)
    launchers = "".join(
        f'extern "C" int emu_launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, '
        f"unsigned shared, void** args, char* err, int size) {{\n"
        f"    const std::string fault = emu::launch({name}, dim3{{gx, gy, gz}}, dim3{{bx, 1, 1}}, shared, args);\n"
        f"    std::strncpy(err, fault.c_str(), size - 1);\n"
        f"    err[size - 1] = 0;\n"
        f"    return fault.empty() ? 0 : 1;\n}}\n"
        for name in names
    )
    return f'#include "emu.h"\n{text}\n{launchers}', names


class EmulatedKernels:
    def __init__(self, library: ctypes.CDLL, names: tuple[str, ...], grid_at_once: bool = False) -> None:
        self._library, self.names, self.grid_at_once = library, names, grid_at_once

    def __getitem__(self, name: str) -> Callable[..., None]:
        if name not in self.names:
            raise KeyError(name)
        entry = getattr(self._library, f"emu_launch_{name}")

        def launch(grid: tuple[int, ...], block: tuple[int, ...], *args: Any, shared_mem: int = 0) -> None:
            values: list[Any] = []
            for arg in args:
                if isinstance(arg, torch.Tensor):
                    if arg.device.type != "cpu":
                        raise ValueError(f"{name}: emulated kernels take CPU tensors, not {arg.device}")
                    values.append(ctypes.c_uint64(arg.data_ptr()))
                elif isinstance(arg, bool | int):
                    values.append(ctypes.c_int32(int(arg)))
                elif isinstance(arg, float):
                    values.append(ctypes.c_float(arg))
                else:
                    raise TypeError(f"{name}: cannot pass {type(arg).__name__}")
            pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
            dims = (*grid, 1, 1)[:3]
            if len(block) > 1 and any(n != 1 for n in block[1:]):
                raise ValueError("emulated launches take 1-D blocks")
            error = ctypes.create_string_buffer(2048)
            self._library.emu_set_grid_at_once(ctypes.c_int(int(self.grid_at_once)))  # the .so may be shared
            if entry(*(ctypes.c_uint(n) for n in dims), ctypes.c_uint(block[0]), ctypes.c_uint(shared_mem),
                     pointers, error, ctypes.c_int(len(error))):
                raise EmulationFault(f"{name}: {error.value.decode()}")

        return launch


def emulate(source: str, params: Mapping[str, Any], directory: Path, *,
            grid_at_once: bool = False) -> EmulatedKernels:
    """Compile ``source`` (a .cu file's text) with ``params`` as #defines for the CPU.

    ``grid_at_once``: every block of a launch runs at the same time (as a grid that fits
    in one wave does on a GPU), for kernels whose blocks wait for each other; otherwise
    one cluster (one block, without ``__cluster_dims__``) at a time. Each block is
    blockDim OS threads, so keep such grids small."""
    unit, names = translation_unit(source, params)
    digest = hashlib.sha256(unit.encode()).hexdigest()[:16]
    library = directory / f"emu-{digest}.so"
    if not library.exists():
        cpp = directory / f"emu-{digest}.cpp"
        cpp.write_text(unit)
        done = subprocess.run(
            ["g++", "-std=c++20", "-O2", "-fPIC", "-shared", "-pthread", "-w", f"-I{HERE}",
             "-o", str(library), str(cpp)],
            capture_output=True, text=True, timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"g++ failed:\n{done.stderr[-4000:]}")
    lib = ctypes.CDLL(str(library))
    for name in names:
        getattr(lib, f"emu_launch_{name}").restype = ctypes.c_int
    return EmulatedKernels(lib, names, grid_at_once)
