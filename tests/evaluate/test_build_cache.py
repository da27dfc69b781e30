"""The build cache: content-addressed, atomic, and never trusted past what it vouches for."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evokernel.evaluate.build import BuildError, check_cuda_nvcc
from evokernel.evaluate.build_cache import BuildCache, build_key

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
KERNEL = 'extern "C" __global__ void add(float* x) { x[threadIdx.x] += WIDTH; }\n'


def test_store_then_load_round_trips(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "builds")
    key = build_key("nvrtc", "13.0", "sm_90a", "source")
    assert cache.load(key) is None
    cache.store(key, b"\x7fELF-cubin", {"compiler": "nvrtc"})
    binary, meta = cache.load(key)  # type: ignore[misc]
    assert binary == b"\x7fELF-cubin" and meta["compiler"] == "nvrtc"
    assert not [p for p in (tmp_path / "builds").iterdir() if p.name.startswith(".")]  # no temp files left


def test_every_part_of_the_key_matters() -> None:
    base = ("nvrtc", "13.0", "sm_90a", "source")
    keys = {build_key(*base)}
    for i in range(len(base)):
        keys.add(build_key(*base[:i], base[i] + "x", *base[i + 1 :]))
    assert len(keys) == len(base) + 1
    assert build_key("ab", "c") != build_key("a", "bc")  # parts cannot run into each other


def test_a_torn_entry_is_a_miss(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)
    cache.store("k", b"0123456789")
    (tmp_path / "k.bin").write_bytes(b"01234")  # a write cut short
    assert cache.load("k") is None
    (tmp_path / "k.json").write_text("{not json")
    assert cache.load("k") is None


@needs_nvcc
def test_nvcc_check_is_not_repeated_for_the_same_source(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)
    source = "#define WIDTH 2\n" + KERNEL
    first = check_cuda_nvcc(source, "sm_90a", cache)
    again = check_cuda_nvcc(source, "sm_90a", cache)
    assert first["build_cached"] == 0.0 and first["build_s"] > 0
    assert again["build_cached"] == 1.0 and again["registers"] == first["registers"]
    other = check_cuda_nvcc("#define WIDTH 3\n" + KERNEL, "sm_90a", cache)  # new parameter value
    assert other["build_cached"] == 0.0


@needs_nvcc
def test_a_failed_build_is_not_cached(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)
    for _ in range(2):
        with pytest.raises(BuildError, match="WIDTH"):
            check_cuda_nvcc(KERNEL, "sm_90a", cache)  # WIDTH undefined
    assert not list(tmp_path.iterdir())
