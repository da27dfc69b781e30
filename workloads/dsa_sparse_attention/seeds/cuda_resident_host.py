"""Host side of the cuda_resident candidate: one launch of sparse_mla_resident per call.

Shapes alone steer the launch (no host synchronisation, CUDA-graph safe). Each query
token's index row is cut into ``splits`` spans, one CTA each (all 16 heads); a CTA
keeps up to MAX_ROWS gathered rows in shared memory at once (see cuda_resident.cu).
The spans of a token are merged in the same launch by every CTA of the token, after a
wait for all of them, so the whole grid must be resident at once: ``spread_splits``
picks the most power-of-two spans (at most 128, one per 16 slots, at most NUM_SPLITS
when that is nonzero) whose CTAs fit in min(TARGET_CTAS, one wave), one wave being the
device's SM count times CTAS_PER_SM. With one span nothing waits. The launch is not
cooperative (CuPy's module functions take no such flag): the cap is the guard, and the
kernel traps rather than hangs if a wait outlasts about a second.

Workspace: per device, the partials and one arrival counter per token, kept between
calls. Counters are zeroed once when allocated and only grow (by EPOCH a call, see the
kernel); buffers grow eagerly (never under graph capture) and old ones are kept alive,
since a captured graph may still point at them.

CLUSTER 8 or 16 (from CLUSTER_FROM_TOKENS tokens up): the other kernel,
sparse_mla_resident_cluster, grid (CLUSTER, T), whose clusters are a token's spans: they
merge through distributed shared memory after a cluster barrier (no partials in global
memory, no counters, no grid-wide wait: any grid size is safe). The launcher opts a
16-CTA cluster in to the non-portable size.

``shared_bytes`` mirrors the kernel's shared-memory layout (the kernel traps if it is
handed less than it needs).
"""

from __future__ import annotations

from typing import Any

import torch

HEADS = 16
CKV = 512
ROW_BYTES = 1168  # 576 bf16 values + 8 of padding
BAR_BYTES = 64  # one mbarrier per copy group (cuda_resident.cu's BAR_BYTES)
MAX_SPREAD = 128  # at most 128 spans: a merge slice of at least 4 of the 512 dims


def ksplit(threads: int, block_n: int) -> int:
    """Warps sharing one 8-slot column tile of the logits (cuda_resident.cu's KSPLIT)."""
    return 2 if (threads // 32) // (block_n // 8) >= 2 else 1


def shared_bytes(threads: int, block_n: int, max_rows: int) -> int:
    """Dynamic shared memory of one CTA (cuda_resident.cu's SMEM_BYTES)."""
    queries = HEADS * ROW_BYTES
    rows = max_rows * ROW_BYTES
    slots = max_rows * 4
    logits = ksplit(threads, block_n) * HEADS * (max_rows + 4) * 4
    probabilities = HEADS * (max_rows + 8) * 2
    stats = 3 * HEADS * 4
    return BAR_BYTES + queries + rows + slots + logits + probabilities + stats


def spread_splits(tokens: int, topk: int, wave: int, target: int, requested: int = 0) -> int:
    """The most power-of-two spans (at most MAX_SPREAD, one per 16 slots, at most
    ``requested`` when nonzero) whose ``tokens * splits`` CTAs fit in
    ``min(target, wave)``; 1 (nothing waits) when not even two fit."""
    limit = min(target, wave) if target > 0 else wave
    most = max(1, min(MAX_SPREAD, topk // 16))
    if requested > 0:
        most = min(most, requested)
    splits = 1
    while splits * 2 <= most and tokens * splits * 2 <= limit:
        splits *= 2
    return splits


def wave_size(device: torch.device, ctas_per_sm: int) -> int:
    """CTAs counted on to be resident at once: SMs times CTAS_PER_SM."""
    return torch.cuda.get_device_properties(device).multi_processor_count * ctas_per_sm


class Workspace:
    """Per-device partials and arrival counters (see the module doc)."""

    def __init__(self) -> None:
        self._by_device: dict[Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._retired: list[tuple[torch.Tensor, ...]] = []

    def get(self, device: torch.device, tokens: int, splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(part_out, part_lse, counters) large enough for this call."""
        pairs = tokens * HEADS * splits
        held = self._by_device.get(device)
        if held is None or held[1].numel() < pairs or held[2].numel() < tokens:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("cuda_resident: the workspace must grow outside graph capture; "
                                   "call once eagerly with this batch size first")
            have = held[1].numel() if held is not None else 0
            capacity = max(pairs, 2 * have, HEADS * MAX_SPREAD)
            counters = max(tokens, 2 * held[2].numel() if held is not None else 0, 64)
            if held is not None:
                self._retired.append(held)
            held = (torch.empty(capacity * CKV, dtype=torch.float32, device=device),
                    torch.empty(capacity, dtype=torch.float32, device=device),
                    torch.zeros(counters, dtype=torch.int32, device=device))
            self._by_device[device] = held
        return held


def build(params: dict, kernels):
    if kernels is None:
        raise RuntimeError("cuda_resident needs compiled kernels (a CUDA device)")
    threads = int(params.get("THREADS", 256))
    block_n = int(params.get("BLOCK_N", 32))
    max_rows = int(params.get("MAX_ROWS", 128))
    ctas_per_sm = int(params.get("CTAS_PER_SM", 1))
    target = int(params.get("TARGET_CTAS", 264))
    requested = int(params.get("NUM_SPLITS", 0))
    cluster = int(params.get("CLUSTER", 0))
    cluster_from = int(params.get("CLUSTER_FROM_TOKENS", 4))
    if cluster not in (0, 8, 16):
        raise ValueError(f"CLUSTER must be 0, 8 or 16, not {cluster}")
    if requested & (requested - 1):
        raise ValueError(f"NUM_SPLITS must be 0 or a power of two, not {requested}")
    smem = shared_bytes(threads, block_n, max_rows)
    workspace = Workspace()
    kernel = kernels["sparse_mla_resident"]
    cluster_kernel = kernels["sparse_mla_resident_cluster"] if cluster else None

    def run(
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        sparse_indices: torch.Tensor,
        sm_scale: torch.Tensor,
        output: torch.Tensor,
        lse: torch.Tensor,
    ) -> None:
        tokens, topk = sparse_indices.shape
        if tokens == 0:
            return
        if cluster_kernel is not None and tokens >= cluster_from:
            cluster_kernel((cluster, tokens, 1), (threads, 1, 1),
                           q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale,
                           output, lse, lse, lse, lse, topk, cluster, -(-topk // cluster),
                           shared_mem=smem)  # no partials, no counters
            return
        splits = spread_splits(tokens, topk, wave_size(output.device, ctas_per_sm), target, requested)
        chunk = -(-topk // splits)
        if splits > 1:
            part_out, part_lse, counters = workspace.get(output.device, tokens, splits)
        else:  # never touched on the one-span path
            part_out = part_lse = counters = lse
        kernel((tokens, splits, 1), (threads, 1, 1),
               q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale,
               output, lse, part_out, part_lse, counters, topk, splits, chunk,
               shared_mem=smem)

    return run
