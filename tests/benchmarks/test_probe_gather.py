"""benchmarks/probe_gather.py's kernels (gather_floor.cu) run by the CPU emulation: each
gathers exactly the rows its span's slot ids name (padding skipped), checked by the XOR
fold of every word it landed; and the probe's own arithmetic."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import probe_gather
from tests.workloads import cuda_emulation

TOKENS, TOPK, SLOTS = 2, 256, 640


def expected_folds(ckv: torch.Tensor, kpe: torch.Tensor, indices: torch.Tensor, span: int) -> list[int]:
    """Per CTA (token-major, then span): the XOR of every 32-bit word of its valid rows."""
    words = torch.cat([ckv.view(SLOTS, -1).view(torch.int32), kpe.view(SLOTS, -1).view(torch.int32)], dim=1)
    folds = []
    for t in range(indices.shape[0]):
        for s in range(indices.shape[1] // span):
            fold = 0
            for slot in indices[t, s * span:(s + 1) * span].tolist():
                if slot >= 0:
                    for w in words[slot].tolist():
                        fold ^= w & 0xFFFFFFFF
            folds.append(fold)
    return folds


@pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on PATH")
def test_each_kernel_lands_exactly_the_named_rows(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(3)
    ckv = torch.randn(SLOTS // 64, 64, 512, generator=generator).to(torch.bfloat16)
    kpe = torch.randn(SLOTS // 64, 64, 64, generator=generator).to(torch.bfloat16)
    indices = torch.randint(0, SLOTS, (TOKENS, TOPK), generator=generator, dtype=torch.int32)
    indices[1, 160:] = -1  # padding: a span cut mid-way and (of 64 slots) one left empty
    inputs = {"ckv_cache": ckv, "kpe_cache": kpe, "sparse_indices": indices}
    source = probe_gather.KERNELS.read_text()
    kernels = cuda_emulation.emulate(source, {"CHECKSUM": 1}, tmp_path)
    for span in (128, 64):
        want = expected_folds(ckv, kpe, indices, span)
        ctas = len(want)
        for method in ("gather_ldg", "gather_async", "gather_bulk"):
            sink = torch.full((ctas + 1,), 7, dtype=torch.int32)
            probe_gather.launch(kernels, method, inputs, span, sink)
            got = [w & 0xFFFFFFFF for w in sink[:ctas].tolist()]
            assert got == want, (method, span)
            assert sink[ctas] == 7, "no CTA writes past its own word"
        sink = torch.full((ctas,), 7, dtype=torch.int32)
        probe_gather.launch(kernels, "slots_only", inputs, span, sink)
        assert sink.tolist() == [int(indices[t, (s + 1) * span - 1])
                                 for t in range(TOKENS) for s in range(TOPK // span)]
        probe_gather.launch(kernels, "launch_only", inputs, span, sink)
        assert sink.tolist() == [0] * ctas



@pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on PATH")
def test_the_wait_passes_once_every_span_arrived_call_after_call(tmp_path: Path) -> None:
    """wait_only with every CTA of the grid at once: each call's CTAs pass their wait and
    leave every token's counter one EPOCH higher (no reset between calls, whatever the
    span count); run a block at a time, the first CTA's wait never ends and traps."""
    indices = torch.arange(TOKENS * TOPK, dtype=torch.int32).reshape(TOKENS, TOPK) % SLOTS
    inputs = {"sparse_indices": indices}
    source = probe_gather.KERNELS.read_text()
    counters = torch.zeros(TOKENS, dtype=torch.int32)
    together = cuda_emulation.emulate(source, {}, tmp_path, grid_at_once=True)
    for call, span in enumerate((64, 128, 64), start=1):
        sink = torch.full((TOKENS * TOPK // span,), -1, dtype=torch.int32)
        probe_gather.launch(together, "wait_only", inputs, span, sink, counters)
        assert counters.tolist() == [1024 * call] * TOKENS
        assert sink.tolist() == [int(indices[t, s * span]) for t in range(TOKENS) for s in range(TOPK // span)]
    one_by_one = cuda_emulation.emulate(source, {}, tmp_path, grid_at_once=False)
    with pytest.raises(cuda_emulation.EmulationFault):
        probe_gather.launch(one_by_one, "wait_only", inputs, 128, torch.zeros(4, dtype=torch.int32), counters)
    with pytest.raises(ValueError, match="counters"):
        probe_gather.launch(together, "wait_only", inputs, 128, torch.zeros(4, dtype=torch.int32))


def test_the_probes_arithmetic() -> None:
    assert probe_gather.spans_for("gather_ldg", [16, 100, 256, 4096], 2048) == [16, 256]
    assert probe_gather.spans_for("gather_async", [16, 128, 256], 2048) == [16, 128]
    assert probe_gather.spans_for("wait_only", [16, 32, 64, 96, 256], 2048, tokens=8) == [64, 256]  # 8 x 32 <= 264
    assert probe_gather.dynamic_shared("gather_bulk", 128) == 16 + 128 * 1152 <= 227 * 1024
    assert probe_gather.dynamic_shared("gather_ldg", 128) == 0
    indices = torch.tensor([[1, -1, 5], [-1, -1, 0]], dtype=torch.int32)
    assert probe_gather.gathered_bytes(indices) == 3 * 1152
    assert probe_gather.floor_us(4_000_000, 4000.0) == pytest.approx(4.0)  # 1 us of bytes + 3
    rows = [{"shape": "a", "method": "gather_ldg", "span": 64, "cupti_us": 10.0},
            {"shape": "b", "method": "gather_ldg", "span": 64, "cupti_us": 14.0},
            {"shape": "a", "method": "gather_ldg", "span": 128, "cupti_us": 11.0},
            {"shape": "b", "method": "gather_ldg", "span": 128, "cupti_us": 12.0},
            {"shape": "a", "method": "wait_only", "span": 16, "cupti_us": 2.0},   # small shapes only
            {"shape": "a", "method": "wait_only", "span": 64, "cupti_us": 4.0},
            {"shape": "b", "method": "wait_only", "span": 64, "cupti_us": 6.0},
            {"shape": "a", "method": "gather_bulk", "span": 128, "cupti_us": None}]
    metrics = probe_gather.summarise(rows)
    assert metrics["gather.gather_ldg.span64.mean_cupti_us"] == 12.0
    assert metrics["gather.gather_ldg.best_span"] == 128
    assert metrics["gather.gather_ldg.best_mean_cupti_us"] == 11.5
    assert metrics["gather.gather_ldg.best_span_per_shape_mean_cupti_us"] == 11.0  # 10 on a, 12 on b
    assert metrics["gather.wait_only.span16.shapes"] == 1
    assert metrics["gather.wait_only.best_span"] == 64, "span 16, timed on one shape, is not compared"
    assert metrics["gather.wait_only.best_span_per_shape_mean_cupti_us"] == 4.0  # 2 on a, 6 on b
    assert "gather.gather_bulk.best_span" not in metrics


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_kernels_compile_for_sm90(tmp_path: Path) -> None:
    """Every kernel the probe times builds for sm_90a (the emulation does not read the
    PTX), with the instructions it is named for."""
    ptx = tmp_path / "gather_floor.ptx"
    subprocess.run(["nvcc", "-arch=sm_90a", "-ptx", "-o", str(ptx), str(probe_gather.KERNELS)],
                   check=True, capture_output=True, timeout=300)
    text = ptx.read_text()
    entries = {line.split(".entry ")[1].split("(")[0] for line in text.splitlines() if ".entry " in line}
    assert entries == set(probe_gather.METHODS)
    for instruction in ("ld.global.nc.v4", "cp.async.cg.shared.global", "cp.async.bulk.shared::cluster",
                        "mbarrier.try_wait.parity", "atom.acq_rel.gpu.global.add.u32", "ld.acquire.gpu.global.u32"):
        assert instruction in text, instruction
