"""Memory the judge shares with a candidate's process, passed as file descriptors.

The judge owns every byte a candidate reads or writes: its inputs and its poisoned,
guard-banded outputs live in *chunks* the judge allocates, and the candidate's
process maps them after receiving their file descriptors over a Unix socket. That
works across PID, mount and network namespaces and user ids, where CUDA's legacy
IPC handles do not (measured on the H200: benchmarks/results/probe-judge-h200-*.json).

- On the CPU a chunk is a ``memfd`` mapped with ``mmap`` on both sides.
- On a GPU a chunk is device memory from CUDA's virtual-memory API (``cuMemCreate``
  with a POSIX file descriptor handle, through ``cuda.bindings``), mapped into each
  process's own address space.

Tensors are views into a chunk's bytes at offsets both sides agree on
(:class:`TensorSpec`); nothing else crosses the boundary.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

_F_SEAL_FUTURE_WRITE = 0x10  # linux/fcntl.h; Python's fcntl does not name it

ALIGN = 256
"""Offset alignment of every tensor in a chunk (wide vector loads need 16; TMA 128)."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives: ``chunk`` id, byte ``offset``, ``shape`` and ``dtype``."""

    chunk: int
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    def to_json(self) -> list[Any]:
        return [self.chunk, self.offset, list(self.shape), self.dtype]

    @staticmethod
    def from_json(data: Sequence[Any]) -> TensorSpec:
        chunk, offset, shape, dtype = data
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}")
        return TensorSpec(int(chunk), int(offset), tuple(int(d) for d in shape), str(dtype))


class Layout:
    """Packs tensors one after another into a chunk, each at an aligned offset."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.size = 0

    def add(self, shape: Sequence[int], dtype: torch.dtype) -> TensorSpec:
        offset = -(-self.size // ALIGN) * ALIGN
        spec = TensorSpec(self.chunk, offset, tuple(int(d) for d in shape), dtype_name(dtype))
        self.size = offset + spec.nbytes
        return spec


def view(raw: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """The tensor ``spec`` describes, as a view of a chunk's uint8 bytes ``raw``."""
    if spec.offset + spec.nbytes > raw.numel():
        raise ValueError("tensor spec runs past the end of its chunk")
    data = raw[spec.offset : spec.offset + spec.nbytes]
    return data.view(DTYPES[spec.dtype]).view(spec.shape)


class _DeviceArray:
    """Exposes a raw device pointer to ``torch.as_tensor`` (CUDA array interface)."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (pointer, False), "version": 3,
        }


class Chunk:
    """One shared allocation: its uint8 bytes as a tensor, and the fd that shares it.

    Created by the judge with :meth:`allocate`; opened in the candidate's process with
    :meth:`open` from the received file descriptor. Close when done: on a GPU the
    mapping holds device memory until every process that mapped it unmaps or exits.
    """

    def __init__(self, raw: torch.Tensor, fd: int, size: int, release: Any) -> None:
        self.raw = raw
        self.fd = fd
        self.size = size
        self._release = release

    @staticmethod
    def allocate(size: int, device: torch.device, *, read_only_elsewhere: bool = False,
                 name: str = "evokernel") -> Chunk:
        """A new chunk. On the CPU its size is sealed (a candidate cannot shrink it under
        the judge's mapping), and with ``read_only_elsewhere`` no other process can map it
        writable at all (the judge keeps its own writable mapping)."""
        size = max(int(size), 1)
        if device.type == "cuda":
            return _gpu_allocate(size, device)  # whole granules: the same reason
        # whole pages: a mapping covers the last page whole, and a process could write its
        # tail past ``size``, where the judge's bytes (its scrub) did not reach, for the
        # lane's next process to read there (red team 8)
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        mapped = mmap.mmap(fd, size)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
        if read_only_elsewhere:
            seals |= _F_SEAL_FUTURE_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals | fcntl.F_SEAL_SEAL)
        return Chunk(torch.frombuffer(mapped, dtype=torch.uint8), fd, size, mapped.close)

    @staticmethod
    def open(fd: int, size: int, device: torch.device, *, writable: bool = True) -> Chunk:
        if device.type == "cuda":
            return _gpu_open(fd, size, device)
        mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that a read-only buffer is read-only
            raw = torch.frombuffer(mapped, dtype=torch.uint8)
        return Chunk(raw, fd, size, mapped.close)

    def tensor(self, spec: TensorSpec) -> torch.Tensor:
        return view(self.raw, spec)

    def close(self) -> None:
        self.raw = torch.empty(0, dtype=torch.uint8)
        with contextlib.suppress(Exception):
            self._release()
        with contextlib.suppress(OSError):
            os.close(self.fd)


# -- CUDA virtual memory ---------------------------------------------------------------


class DeviceMemoryError(MemoryError):
    """The device had no room for a chunk, even with torch's cached blocks given back."""


def _check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed with {err}")
    return rest[0] if len(rest) == 1 else rest


def _properties(device_index: int) -> Any:
    from cuda.bindings import driver as d

    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_index
    prop.requestedHandleTypes = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return prop


def _map(handle: Any, size: int, device_index: int) -> tuple[int, Any]:
    """Reserve an address range, map ``handle`` into it, allow reads and writes."""
    from cuda.bindings import driver as d

    pointer = _check(d.cuMemAddressReserve(size, 0, 0, 0))
    _check(d.cuMemMap(pointer, size, 0, handle, 0))
    access = d.CUmemAccessDesc()
    access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = device_index
    access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    _check(d.cuMemSetAccess(pointer, size, [access], 1))

    def release() -> None:
        # the driver calls need the primary context current in the calling thread, which
        # may be one that has made no CUDA call yet (an evaluation's thread, pipeline)
        torch.zeros(1, device=torch.device("cuda", device_index))
        d.cuMemUnmap(pointer, size)
        d.cuMemAddressFree(pointer, size)
        d.cuMemRelease(handle)

    return int(pointer), release


def _granularity(device_index: int) -> int:
    from cuda.bindings import driver as d

    flag = d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    return int(_check(d.cuMemGetAllocationGranularity(_properties(device_index), flag)))


def _gpu_allocate(size: int, device: torch.device) -> Chunk:
    from cuda.bindings import driver as d

    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.zeros(1, device=device)  # the primary context must be current for driver calls
    step = _granularity(index)
    size = -(-size // step) * step
    created = d.cuMemCreate(size, _properties(index), 0)
    if created[0] == d.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
        # torch's caching allocator may hold the memory free: give it back, try once more
        torch.cuda.empty_cache()
        created = d.cuMemCreate(size, _properties(index), 0)
    if created[0] == d.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
        free, total = torch.cuda.mem_get_info(index)
        raise DeviceMemoryError(
            f"no room on the device for a shared chunk of {size / (1 << 30):.2f} GiB "
            f"({free / (1 << 30):.2f} of {total / (1 << 30):.2f} GiB free)")
    handle = _check(created)
    fd = int(_check(d.cuMemExportToShareableHandle(
        handle, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)))
    pointer, release = _map(handle, size, index)
    raw = torch.as_tensor(_DeviceArray(pointer, size), device=device)
    raw.zero_()  # as a CPU chunk (a memfd) starts: nothing the device held before shows through
    return Chunk(raw, fd, size, release)


def _gpu_open(fd: int, size: int, device: torch.device) -> Chunk:
    from cuda.bindings import driver as d

    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.zeros(1, device=device)
    handle = _check(d.cuMemImportFromShareableHandle(
        fd, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    pointer, release = _map(handle, size, index)
    raw = torch.as_tensor(_DeviceArray(pointer, size), device=device)
    return Chunk(raw, fd, size, release)
