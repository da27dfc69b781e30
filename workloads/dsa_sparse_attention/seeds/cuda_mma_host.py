"""Host side of the cuda_mma candidate: launches sparse_mla_split (and, with COMBINE
separate, sparse_mla_combine after it).

Shapes alone steer the launches (no host synchronisation, CUDA-graph safe). The
index row of each query token is cut into ``splits`` spans; one CTA per (token, head
group, span) attends over its span. With more than one span the spans are merged by
their log-sum-exp: COMBINE fused: by the last CTA of each (token, head group) to
finish, in the same launch (one launch per call); COMBINE separate: by a second
kernel. NUM_SPLITS 0 picks the fewest power-of-two spans that give TARGET_CTAS CTAs
(at least one gather step per span, at most MAX_SPLITS: the fused merge reads every
span's 32 KB partial on one SM).

COMBINE spread: every CTA of a (token, head group) waits until all its spans have
arrived, then merges a slice of the 512 output dims (one launch per call). The wait
is safe only if the whole grid is resident at once, so ``spread_splits`` picks the
most power-of-two spans (at most 128, one per 16 slots, at most NUM_SPLITS when that
is nonzero) whose CTAs fit in min(TARGET_CTAS, one wave): one wave is the device's SM
count times RESIDENT_PER_SM (1: one CTA always fits if the kernel launches at all).
With one span nothing waits. The launch is not cooperative (cuPy's module functions
take no such flag): the cap is the only guard. The counters grow by EPOCH per call
(see cuda_mma.cu) and are never reset.

Workspace (COMBINE fused or spread): per device, the partials and one arrival counter per
(token, head group), kept between calls. The counters are zeroed once when allocated
and the kernel leaves them at zero, so no call launches a memset; the buffers grow
eagerly (never under graph capture) and old ones are kept alive, since a captured
graph may still point at them. COMBINE separate allocates its partials per call
(``torch.empty``, no launch).

``shared_bytes`` mirrors the shared-memory layout of cuda_mma.cu (the kernel traps if
it is handed less than it needs).
"""

from __future__ import annotations

from typing import Any

import torch

HEADS = 16
CKV = 512
ROW_BYTES = 1168  # 576 bf16 values + 8 of padding
SMEM_LIMIT = 232448  # 227 KiB per block on sm_90
BAR_BYTES = 64  # the gather buffers' mbarriers (cuda_mma.cu's BAR_BYTES)
EPOCH = 1024  # what one call adds to a spread counter (cuda_mma.cu's EPOCH)
RESIDENT_PER_SM = 1  # CTAs surely resident per SM, for the spread grid's cap
MAX_SPREAD = 128  # spread: at most 128 spans (a slice of at least 4 of the 512 dims)


def pipeline_depth(block_n: int, stages: int) -> int:
    """The gather buffers the kernel really uses: STAGES, or fewer if they do not fit."""
    for depth in (stages, 3, 2):
        if depth <= stages and _bytes(block_n, depth) <= SMEM_LIMIT:
            return depth
    return 2


def _bytes(block_n: int, depth: int) -> int:
    fixed = BAR_BYTES + HEADS * ROW_BYTES + HEADS * (block_n + 4) * 4 + HEADS * (block_n + 8) * 2 + 3 * HEADS * 4
    return fixed + depth * (block_n * ROW_BYTES + block_n * 4)


def shared_bytes(block_n: int, stages: int) -> int:
    return _bytes(block_n, pipeline_depth(block_n, stages))


def choose_splits(
    tokens: int, groups: int, topk: int, block_n: int, target: int, cap: int | None = None
) -> int:
    """The fewest power-of-two splits giving ``target`` CTAs, at most one per gather
    step and at most ``cap``."""
    splits = 1
    most = max(1, topk // block_n)
    if cap is not None:
        most = min(most, cap)
    while tokens * groups * splits < target and splits * 2 <= most:
        splits *= 2
    return splits


def spread_splits(tokens: int, groups: int, topk: int, wave: int, target: int, requested: int = 0) -> int:
    """COMBINE spread: the most power-of-two spans (at most MAX_SPREAD, one per 16 slots,
    at most ``requested`` when nonzero) whose ``tokens * groups * splits`` CTAs fit in
    ``min(target, wave)``; 1 (nothing waits) when not even two fit."""
    limit = min(target, wave) if target > 0 else wave
    most = max(1, min(MAX_SPREAD, topk // 16))
    if requested > 0:
        most = min(most, requested)
    splits = 1
    while splits * 2 <= most and tokens * groups * splits * 2 <= limit:
        splits *= 2
    return splits


def wave_size(device: torch.device) -> int:
    """CTAs surely resident at once: SMs times RESIDENT_PER_SM."""
    return torch.cuda.get_device_properties(device).multi_processor_count * RESIDENT_PER_SM


class Workspace:
    """Per-device partials and arrival counters of the fused combine (see the module doc)."""

    def __init__(self) -> None:
        self._by_device: dict[Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._retired: list[tuple[torch.Tensor, ...]] = []

    def get(
        self, device: torch.device, tokens: int, groups: int, splits: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(part_out, part_lse, counters) large enough for this call."""
        pairs = tokens * HEADS * splits
        held = self._by_device.get(device)
        if (held is None or held[0].numel() < pairs * CKV or held[1].numel() < pairs
                or held[2].numel() < tokens * groups):
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("cuda_mma: the workspace must grow outside graph capture; "
                                   "call once eagerly with this batch size first")
            have = held[1].numel() if held is not None else 0
            capacity = max(pairs, 2 * have, 16 * HEADS * 16)
            counters = max(tokens * groups, 2 * held[2].numel() if held is not None else 0, 64)
            if held is not None:
                self._retired.append(held)
            held = (torch.empty(capacity * CKV, dtype=torch.float32, device=device),
                    torch.empty(capacity, dtype=torch.float32, device=device),
                    torch.zeros(counters, dtype=torch.int32, device=device))
            self._by_device[device] = held
        return held


def build(params: dict, kernels):
    if kernels is None:
        raise RuntimeError("cuda_mma needs compiled kernels (a CUDA device)")
    num_splits = int(params.get("NUM_SPLITS", 0))
    heads_per_cta = int(params.get("HEADS_PER_CTA", 16))
    block_n = int(params.get("BLOCK_N", 32))
    stages = int(params.get("STAGES", 2))
    threads = int(params.get("THREADS", 128))
    target = int(params.get("TARGET_CTAS", 264))
    cap = int(params.get("MAX_SPLITS", 16))
    combine = str(params.get("COMBINE", "fused"))
    if combine not in ("fused", "separate", "spread"):
        raise ValueError(f"COMBINE {combine!r} is not fused, separate or spread")
    fused, spread = combine == "fused", combine == "spread"
    if spread and num_splits & (num_splits - 1):
        raise ValueError(f"COMBINE spread needs a power-of-two NUM_SPLITS, not {num_splits}")
    workspace = Workspace()
    groups = HEADS // heads_per_cta
    smem = shared_bytes(block_n, stages)
    split_kernel = kernels["sparse_mla_split"]
    combine_kernel = kernels["sparse_mla_combine"]

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
        if spread:
            splits = spread_splits(tokens, groups, topk, wave_size(output.device), target, num_splits)
        else:
            splits = num_splits or choose_splits(tokens, groups, topk, block_n, target, cap)
        chunk = -(-topk // splits)
        counters: torch.Tensor = lse  # never touched unless fused or spread with several splits
        if splits > 1 and (fused or spread):
            part_out, part_lse, counters = workspace.get(output.device, tokens, groups, splits)
        elif splits > 1:
            part_out = torch.empty(tokens, HEADS, splits, CKV, device=output.device,
                                   dtype=torch.float32)
            part_lse = torch.empty(tokens, HEADS, splits, device=output.device,
                                   dtype=torch.float32)
        else:
            part_out = part_lse = lse  # never written on the one-split path
        split_kernel(
            (tokens, groups, splits),
            (threads, 1, 1),
            q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale,
            output, lse, part_out, part_lse, counters, topk, splits, chunk,
            shared_mem=smem,
        )
        if splits > 1 and not (fused or spread):
            combine_kernel((tokens * HEADS, 1, 1), (128, 1, 1),
                           part_out, part_lse, output, lse, splits)

    return run
