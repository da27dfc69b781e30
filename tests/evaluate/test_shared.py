"""Shared chunks: the same bytes seen through two mappings, tensors at agreed offsets."""

from __future__ import annotations

import os

import pytest
import torch

from evokernel.evaluate.shared import ALIGN, Chunk, Layout, TensorSpec


def test_layout_aligns_and_round_trips() -> None:
    layout = Layout(chunk=7)
    a = layout.add((3, 5), torch.float32)
    b = layout.add((2,), torch.float8_e4m3fn)
    c = layout.add((4, 4), torch.int64)
    assert [s.offset % ALIGN for s in (a, b, c)] == [0, 0, 0]
    assert b.offset >= a.offset + a.nbytes and c.offset >= b.offset + b.nbytes
    assert TensorSpec.from_json(c.to_json()) == c
    assert layout.size == c.offset + c.nbytes


def test_a_second_mapping_of_the_fd_sees_the_same_memory() -> None:
    layout = Layout(chunk=1)
    spec = layout.add((4, 8), torch.bfloat16)
    judge = Chunk.allocate(layout.size, torch.device("cpu"))
    other = Chunk.open(os.dup(judge.fd), judge.size, torch.device("cpu"))
    mine, theirs = judge.tensor(spec), other.tensor(spec)
    mine.copy_(torch.arange(32, dtype=torch.bfloat16).view(4, 8))
    assert torch.equal(theirs, mine)
    theirs.fill_(-1)
    assert bool((mine == -1).all())
    other.close()
    judge.close()


def test_a_spec_past_the_end_is_refused() -> None:
    chunk = Chunk.allocate(1024, torch.device("cpu"))
    try:
        chunk.tensor(TensorSpec(0, chunk.size - 24, (100,), "float32"))
    except ValueError as exc:
        assert "past the end" in str(exc)
    else:
        raise AssertionError("expected a ValueError")
    finally:
        chunk.close()


def test_every_byte_a_candidate_can_map_is_the_judges_to_scrub() -> None:
    """A mapping covers whole pages: on a chunk whose size is not a multiple of one, a
    process could write past the size, in the last page's tail, which the judge's bytes
    (and so its scrub) did not cover, and the lane's next process would map the same page
    and read it (red team 8). The chunk is now whole pages."""
    import ctypes
    import mmap

    chunk = Chunk.allocate(1000, torch.device("cpu"))
    assert chunk.size % mmap.PAGESIZE == 0 and chunk.raw.numel() == chunk.size
    theirs = mmap.mmap(os.dup(chunk.fd), 1000)  # as a candidate maps what it was told
    start = ctypes.addressof(ctypes.c_char.from_buffer(theirs))
    ctypes.memset(start + 1000, 0x5A, mmap.PAGESIZE - 1000)  # the page's tail
    chunk.raw.zero_()  # the judge's scrub
    later = mmap.mmap(os.dup(chunk.fd), 1000)
    tail = ctypes.string_at(ctypes.addressof(ctypes.c_char.from_buffer(later)) + 1000,
                            mmap.PAGESIZE - 1000)
    assert tail == bytes(mmap.PAGESIZE - 1000)
    chunk.close()


class _Created(Exception):
    """Raised by the fake driver once a chunk was created (the test stops there)."""


def _fake_driver(monkeypatch: pytest.MonkeyPatch, results: list[int]) -> list[str]:
    """A CUDA driver whose cuMemCreate answers with ``results`` in turn (0: success, 2:
    out of memory), and torch's device calls recorded, so that the device path of
    ``Chunk.allocate`` runs here without a GPU."""
    import enum
    import sys
    import types

    from evokernel.evaluate import shared

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_OUT_OF_MEMORY = 2

    calls: list[str] = []

    def create(size: int, prop: object, flags: int) -> tuple[CUresult, object]:
        calls.append("create")
        return CUresult(results.pop(0)), object()

    def export(*_: object) -> tuple[CUresult, int]:
        raise _Created

    driver = types.SimpleNamespace(CUresult=CUresult, cuMemCreate=create,
                                   cuMemExportToShareableHandle=export,
                                   CUmemAllocationHandleType=types.SimpleNamespace(
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR=1))
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)  # type: ignore[arg-type]
    monkeypatch.setattr(shared, "_granularity", lambda index: 1 << 21)
    monkeypatch.setattr(shared, "_properties", lambda index: None)
    monkeypatch.setattr(shared.torch, "zeros", lambda *a, **k: None)
    monkeypatch.setattr(shared.torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(shared.torch.cuda, "mem_get_info", lambda index: (1 << 30, 80 << 30))
    return calls


def test_a_device_short_of_memory_gives_torchs_cache_back_and_tries_once_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_driver(monkeypatch, [2, 0])
    with pytest.raises(_Created):
        Chunk.allocate(3 << 20, torch.device("cuda", 0))
    assert calls == ["create", "empty_cache", "create"]


def test_a_device_still_short_of_memory_says_how_much_was_free(monkeypatch: pytest.MonkeyPatch) -> None:
    from evokernel.evaluate.shared import DeviceMemoryError

    calls = _fake_driver(monkeypatch, [2, 2])
    with pytest.raises(DeviceMemoryError, match=r"4\.00 GiB \(1\.00 of 80\.00 GiB free\)"):
        Chunk.allocate(4 << 30, torch.device("cuda", 0))
    assert calls == ["create", "empty_cache", "create"]
    calls = _fake_driver(monkeypatch, [0])
    with pytest.raises(_Created):  # room at once: no cache given back
        Chunk.allocate(1 << 20, torch.device("cuda", 0))
    assert calls == ["create"]
