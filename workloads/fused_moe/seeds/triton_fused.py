"""FP8 block-scale DeepSeek MoE rank in Triton, in the style of the fused-MoE kernels
of the SGLang and vLLM serving engines.

A call issues device work only: no value is read back to the host, every launch's grid
and every buffer's size follows from the shapes alone, and the buffers (worst-case
sized) are allocated on a shape's first call and reused after, so that the whole call
can be captured in a CUDA graph. With the default knobs a call is 4 device operations
up to ``ONE_PROGRAM_ROUTING_UP_TO`` tokens and 5 above:

1. Routing and alignment. Per token: sigmoid scores, the biased scores' group top-2
   sums, the 4 best groups, the 8 best experts in them, weights from the unbiased
   scores, normalised, times the scaling factor; each (token, slot) pair gets its
   local expert (or none: another rank's). The local pairs are then placed in rows
   sorted by expert, each expert's run padded to a multiple of ``BLOCK_M`` rows so
   that every row block of the grouped GEMMs belongs to one expert, and each row block
   is labelled with its expert (blocks past the last one with ``num_local``: they exit
   at once). Tokens are routed ``ROUTE_TOKENS`` at a time; a pair's row is its
   expert's first row plus the pairs of that expert in earlier token blocks plus those
   before it in its own block (a deterministic, stable order). Small batches do all of
   it in one program (one launch); larger ones in a routing kernel over token blocks
   (each writes its block's per-expert counts) and an alignment kernel over the same
   blocks (each sums the counts before it).
2. GEMM1 (grouped, FP8 x FP8 on the tensor cores, fp32 accumulation): for a block of
   rows and ``BLOCK_N1`` intermediate columns, both the up and the gate columns; each
   128-deep K step's product is scaled by the activation's and the weight's block
   scales before it is accumulated. ``SPLIT_K1`` splits the 56 K blocks among programs.
   ``SWAP_AB`` computes weights x activations^T, so that the weight tile fills the
   warpgroup MMA's 64-row side and a few token rows its narrow side (fp8 ``wgmma``
   from 16 rows; unswapped, fewer than 64 rows fall back to ``mma.sync`` on fp8
   widened to fp16). With ``CLEAR=gemm1`` its programs also zero the fp32 combine
   buffer GEMM2 adds into.
3. SwiGLU ``silu(gate) * up`` and quantisation of the result for GEMM2
   (``INTERMEDIATE=fp8``: per row and ``BLOCK_N1`` columns, scale amax/448;
   ``bf16``: no quantisation). With ``FUSE_SWIGLU`` and no split-K this is GEMM1's
   epilogue; with split-K the splits add fp32 partials atomically and the one that
   finishes a tile last (a counter per tile, acq_rel) applies it, then returns the sums
   and the counter to zero for the next call (buffers zeroed once, at allocation).
   Without ``FUSE_SWIGLU``, GEMM1 writes (or adds) fp32 and a small kernel does it.
4. GEMM2 (grouped) over the intermediate, ``SPLIT_K2`` ways, times each pair's
   routing weight; each pipelined K step is one 128-deep weight scale block, made of
   ``BLOCK_N1``-deep products when the fp8 intermediate has finer scales.
5. Combine. ``COMBINE=atomic``: GEMM2 adds into an fp32 [T, 7168] buffer, then a cast.
   ``gather``: GEMM2 writes one row per pair and a kernel sums each token's rows in
   slot order (deterministic).

Tile sizes, split-K factors, swapped products, pipeline stages and warps are knobs of
each of three token-count bands (``SMALL_*`` up to ``SMALL_UP_TO`` tokens, ``MID_*`` up
to ``MID_UP_TO``, ``LARGE_*`` above), chosen per call from the batch's token count as
the engines key their tuned tables; fusion, the intermediate's format, the combine
method and the routing layout are global (triton_fused.yaml). The space holds the
triton_baseline's table band by band. ``compile_kernels`` compiles every kernel of a
configuration and band ahead of time for any target, as the launcher specialises them
(aligned pointers), so the tests build them for sm_90 on a machine without a GPU.

Why the first version (one tile for every batch: BLOCK_M 64, BLOCK_N1 128, BLOCK_N2
128, 8/4 warps, no split-K) was 0.57x the baseline at one token and 0.73-0.80x at 14-80
tokens on the H200 (2026-12-04), and about even from 901 up: hypotheses from reading
both pipelines and the sm_90 builds, none measured yet.

- Too few programs stream the weights. Up to ~80 tokens the call is bound by the
  bytes of the chosen experts' weights (44 MB an expert). At one token (one or two
  local experts) GEMM1 had 16 programs an expert, each reading 1.8 MB through one
  SM's load pipeline, and GEMM2 56; the baseline (BLOCK_N 64) has 64 and 112. The 7-
  and 1-token times being alike (157 vs 145 us for 5x the experts) says per-program
  latency, not bandwidth, set them. Remedy: narrow column tiles and split-K (both
  GEMMs; GEMM1's with SwiGLU kept fused by the last split) in the SMALL band.
- One program a SM. A 64x(128+128) GEMM1 tile with 3 stages takes 123 KB of shared
  memory, so each SM runs one program and streams nothing while it fills its pipeline
  or runs the SwiGLU epilogue; 512 programs at 32 experts are also 3.9 waves on 132
  SMs. The baseline's 16-row tiles (~55 KB) fit 3-4 programs a SM. Remedy: BLOCK_M 16
  and 64-column GEMM1 tiles in the SMALL and MID bands.
- The baseline pays for its small tiles elsewhere: with fewer than 64 rows Triton
  uses mma.sync and widens every fp8 weight tile to fp16 in registers (ALU work per
  weight byte). Swapped products give 16-row tiles on fp8 wgmma: small tiles without
  that cost, a configuration neither the first version nor the baseline had.
- Not believed to matter much: the routing-and-alignment program at one token (one
  CTA, a few microseconds), the fp32 combine and its cast (T x 7168 x 6 bytes), grid
  order (row blocks vary fastest, so programs of one expert and column block share
  its weight tile in L2), and the earlier sm_90 test build: without the launcher's
  pointer alignment it loaded tiles byte by byte, unpipelined, which the GPU never ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

BLOCK = 128
TOP_K = 8
NUM_GROUPS = 8
TOPK_GROUPS = 4
FP8_MAX = 448.0
LABEL_BLOCKS = 128
"""Row blocks labelled with their expert per step of the alignment."""
COUNT_ROWS = 64
"""Token blocks' expert counts read per step of the alignment kernel."""
CLEAR_STEP = 1024
"""Elements of the combine buffer one GEMM1 program zeroes per step."""


# -- 1. routing and alignment ----------------------------------------------------------------


@triton.jit
def _route_block(
    block, logits_ptr, bias_ptr, factor_ptr, offset_ptr, local_ptr, weights_ptr, num_tokens,
    NUM_EXPERTS: tl.constexpr, NUM_LOCAL: tl.constexpr, GROUPS: tl.constexpr,
    KEEP_GROUPS: tl.constexpr, K: tl.constexpr, TOKENS: tl.constexpr,
):
    """Route tokens [block * TOKENS, +TOKENS): store each pair's local expert (NUM_LOCAL
    for another rank's) and routing weight; return the block's pairs per local expert."""
    GROUP_SIZE: tl.constexpr = NUM_EXPERTS // GROUPS
    token = block * TOKENS + tl.arange(0, TOKENS)
    token_ok = token < num_tokens
    token64 = token.to(tl.int64)
    expert = tl.arange(0, NUM_EXPERTS)
    logit = tl.load(logits_ptr + token64[:, None] * NUM_EXPERTS + expert[None, :],
                    mask=token_ok[:, None], other=0.0)
    score = 1.0 / (1.0 + tl.exp(-logit))
    biased = score + tl.load(bias_ptr + expert).to(tl.float32)[None, :]

    grouped = tl.reshape(biased, (TOKENS, GROUPS, GROUP_SIZE))
    column = tl.arange(0, GROUP_SIZE)
    first = tl.argmax(grouped, axis=2)
    best = tl.max(grouped, axis=2)
    second = tl.max(tl.where(column[None, None, :] == first[:, :, None], float("-inf"), grouped), axis=2)
    group_score = best + second

    group = tl.arange(0, GROUPS)
    keep = tl.zeros([TOKENS, GROUPS], dtype=tl.int32)
    for _ in tl.static_range(KEEP_GROUPS):
        pick = tl.argmax(tl.where(keep != 0, float("-inf"), group_score), axis=1)
        keep = tl.where(group[None, :] == pick[:, None], 1, keep)
    kept = tl.reshape(tl.broadcast_to(keep[:, :, None], (TOKENS, GROUPS, GROUP_SIZE)), (TOKENS, NUM_EXPERTS))
    candidate = tl.where(kept != 0, biased, float("-inf"))

    slot = tl.arange(0, K)
    ids = tl.zeros([TOKENS, K], dtype=tl.int32)
    chosen = tl.zeros([TOKENS, K], dtype=tl.float32)
    for j in tl.static_range(K):
        pick = tl.argmax(candidate, axis=1)
        hit = expert[None, :] == pick[:, None]
        ids = tl.where(slot[None, :] == j, pick[:, None], ids)
        chosen = tl.where(slot[None, :] == j, tl.sum(tl.where(hit, score, 0.0), axis=1)[:, None], chosen)
        candidate = tl.where(hit, float("-inf"), candidate)
    weight = chosen / tl.sum(chosen, axis=1)[:, None] * tl.load(factor_ptr)

    local = ids - tl.load(offset_ptr)
    local = tl.where((local >= 0) & (local < NUM_LOCAL) & token_ok[:, None], local, NUM_LOCAL)
    pair = token64[:, None] * K + slot[None, :]
    tl.store(local_ptr + pair, local, mask=token_ok[:, None])
    tl.store(weights_ptr + pair, weight, mask=token_ok[:, None])
    flat = tl.reshape(local, (TOKENS * K,))
    return tl.sum((flat[:, None] == tl.arange(0, NUM_LOCAL)[None, :]).to(tl.int32), axis=0)


@triton.jit
def _layout(totals, BLOCK_M: tl.constexpr):
    """(first row, end in row blocks) of each local expert's padded run of rows."""
    blocks = (totals + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, axis=0)
    return (block_end - blocks) * BLOCK_M, block_end


@triton.jit
def _place_block(
    block, before, row_start, local_ptr, pair_of_row_ptr, row_of_pair_ptr, num_pairs,
    NUM_LOCAL: tl.constexpr, PAIRS: tl.constexpr,
):
    """Give each local pair of token block ``block`` its row: its expert's first row,
    plus ``before`` (that expert's pairs in earlier blocks), plus its expert's pairs
    before it in this block. Returns the block's pairs per local expert."""
    pair = block * PAIRS + tl.arange(0, PAIRS)
    pair_ok = pair < num_pairs
    local = tl.load(local_ptr + pair, mask=pair_ok, other=NUM_LOCAL)
    onehot = (local[:, None] == tl.arange(0, NUM_LOCAL)[None, :]).to(tl.int32)
    earlier = tl.cumsum(onehot, axis=0) - onehot
    row = tl.sum(onehot * (earlier + (row_start + before)[None, :]), axis=1)
    is_local = local < NUM_LOCAL
    tl.store(pair_of_row_ptr + row, pair, mask=is_local & pair_ok)
    tl.store(row_of_pair_ptr + pair, tl.where(is_local, row, -1), mask=pair_ok)
    return tl.sum(onehot, axis=0)


@triton.jit
def _label_blocks(
    first, step, max_blocks, block_end, block_expert_ptr, NUM_LOCAL: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    """Row blocks first*BLOCKS.. (every step*BLOCKS): their expert, NUM_LOCAL past the last."""
    for start in range(first * BLOCKS, max_blocks, step * BLOCKS):
        b = start + tl.arange(0, BLOCKS)
        expert = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, expert, mask=b < max_blocks)


@triton.jit
def _pad_rows(
    row_start, totals, pair_of_row_ptr, num_pairs, NUM_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Mark each expert's padding rows (after its pairs, to its run's end) as no pair."""
    j = tl.arange(0, BLOCK_M)[None, :]
    padded = (totals + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    row = (row_start + totals)[:, None] + j
    none = tl.zeros([NUM_LOCAL, BLOCK_M], dtype=tl.int32) + num_pairs
    tl.store(pair_of_row_ptr + row, none, mask=totals[:, None] + j < padded[:, None])


@triton.jit
def route_align_kernel(
    logits_ptr, bias_ptr, factor_ptr, offset_ptr, local_ptr, weights_ptr,
    pair_of_row_ptr, block_expert_ptr, row_of_pair_ptr, num_tokens, max_blocks,
    NUM_EXPERTS: tl.constexpr, NUM_LOCAL: tl.constexpr, GROUPS: tl.constexpr,
    KEEP_GROUPS: tl.constexpr, K: tl.constexpr, TOKENS: tl.constexpr, BLOCK_M: tl.constexpr,
    LABEL: tl.constexpr,
):
    """Routing and alignment of a whole (small) batch in one program."""
    num_blocks = tl.cdiv(num_tokens, TOKENS)
    totals = tl.zeros([NUM_LOCAL], dtype=tl.int32)
    for block in range(0, num_blocks):
        totals += _route_block(block, logits_ptr, bias_ptr, factor_ptr, offset_ptr, local_ptr,
                               weights_ptr, num_tokens, NUM_EXPERTS, NUM_LOCAL, GROUPS,
                               KEEP_GROUPS, K, TOKENS)
    tl.debug_barrier()  # the local experts stored above are read back by other threads
    row_start, block_end = _layout(totals, BLOCK_M)
    before = tl.zeros([NUM_LOCAL], dtype=tl.int32)
    for block in range(0, num_blocks):
        before += _place_block(block, before, row_start, local_ptr, pair_of_row_ptr,
                               row_of_pair_ptr, num_tokens * K, NUM_LOCAL, TOKENS * K)
    _label_blocks(0, 1, max_blocks, block_end, block_expert_ptr, NUM_LOCAL, LABEL)
    _pad_rows(row_start, totals, pair_of_row_ptr, num_tokens * K, NUM_LOCAL, BLOCK_M)


@triton.jit
def route_kernel(
    logits_ptr, bias_ptr, factor_ptr, offset_ptr, local_ptr, weights_ptr, counts_ptr, num_tokens,
    NUM_EXPERTS: tl.constexpr, NUM_LOCAL: tl.constexpr, GROUPS: tl.constexpr,
    KEEP_GROUPS: tl.constexpr, K: tl.constexpr, TOKENS: tl.constexpr,
):
    """Routing of one token block per program; its pairs per local expert to counts[block]."""
    block = tl.program_id(0)
    counts = _route_block(block, logits_ptr, bias_ptr, factor_ptr, offset_ptr, local_ptr,
                          weights_ptr, num_tokens, NUM_EXPERTS, NUM_LOCAL, GROUPS, KEEP_GROUPS,
                          K, TOKENS)
    tl.store(counts_ptr + block * NUM_LOCAL + tl.arange(0, NUM_LOCAL), counts)


@triton.jit
def align_kernel(
    local_ptr, counts_ptr, pair_of_row_ptr, block_expert_ptr, row_of_pair_ptr, num_tokens, max_blocks,
    NUM_LOCAL: tl.constexpr, K: tl.constexpr, TOKENS: tl.constexpr, BLOCK_M: tl.constexpr,
    LABEL: tl.constexpr, COUNT_ROWS: tl.constexpr,
):
    """Alignment, one token block per program (after route_kernel): every program sums
    all blocks' counts (the layout) and those of the blocks before its own (its offsets)."""
    block = tl.program_id(0)
    num_blocks = tl.num_programs(0)
    expert = tl.arange(0, NUM_LOCAL)
    totals = tl.zeros([NUM_LOCAL], dtype=tl.int32)
    before = tl.zeros([NUM_LOCAL], dtype=tl.int32)
    for start in range(0, num_blocks, COUNT_ROWS):
        other = start + tl.arange(0, COUNT_ROWS)
        counts = tl.load(counts_ptr + other[:, None] * NUM_LOCAL + expert[None, :],
                         mask=(other < num_blocks)[:, None], other=0)
        totals += tl.sum(counts, axis=0)
        before += tl.sum(tl.where((other < block)[:, None], counts, 0), axis=0)
    row_start, block_end = _layout(totals, BLOCK_M)
    _place_block(block, before, row_start, local_ptr, pair_of_row_ptr, row_of_pair_ptr,
                 num_tokens * K, NUM_LOCAL, TOKENS * K)
    _label_blocks(block, num_blocks, max_blocks, block_end, block_expert_ptr, NUM_LOCAL, LABEL)
    if block == 0:
        _pad_rows(row_start, totals, pair_of_row_ptr, num_tokens * K, NUM_LOCAL, BLOCK_M)


# -- 2./3. GEMM1 and SwiGLU ------------------------------------------------------------------


@triton.jit
def _swiglu_store(
    up, gate, rows, row_ok, col_block, h_ptr, h_scale_ptr,
    INTER: tl.constexpr, BLOCK_N: tl.constexpr, OUT_FP8: tl.constexpr,
):
    """silu(gate) * up for a [BLOCK_M, BLOCK_N] tile, stored as fp8 + scale or bf16."""
    h = gate / (1.0 + tl.exp(-gate)) * up
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    rows64 = rows.to(tl.int64)
    if OUT_FP8:
        amax = tl.maximum(tl.max(tl.abs(h), axis=1), 1e-10)
        scale = amax / 448.0
        q = (h / scale[:, None]).to(tl.float8e4nv)
        tl.store(h_ptr + rows64[:, None] * INTER + cols[None, :], q, mask=row_ok[:, None])
        tl.store(h_scale_ptr + rows64 * (INTER // BLOCK_N) + col_block, scale, mask=row_ok)
    else:
        tl.store(h_ptr + rows64[:, None] * INTER + cols[None, :], h.to(tl.bfloat16), mask=row_ok[:, None])


@triton.jit
def _tile_ids(COLUMNS_FIRST: tl.constexpr):
    """(row block, column block) of this program: the grid's first axis is the row blocks
    (GRID_ORDER rows: programs of one column tile over every row block launch together,
    sharing its weights) or the column blocks (columns: the row blocks in use, which come
    first, launch before those of no local expert, which only exit)."""
    if COLUMNS_FIRST:
        return tl.program_id(1), tl.program_id(0)
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def gemm1_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, pair_of_row_ptr, block_expert_ptr,
    out_ptr, h_ptr, h_scale_ptr, clear_ptr, arrived_ptr, num_tokens, clear_numel, clear_per_program,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    SWIGLU_EPILOGUE: tl.constexpr, FIXUP: tl.constexpr, SWAP_AB: tl.constexpr,
    OUT_FP8: tl.constexpr, STAGES: tl.constexpr, CLEAR: tl.constexpr, CLEAR_STEP: tl.constexpr,
    COLUMNS_FIRST: tl.constexpr = False,
):
    """Rows of one expert x BLOCK_N up columns and the matching gate columns.

    CLEAR: every program first zeroes its share (``clear_per_program`` elements, a
    multiple of CLEAR_STEP) of the ``clear_numel`` fp32 elements at ``clear_ptr``.
    SWAP_AB: the products are computed transposed, weights x activations^T, so that the
    weight tile (BLOCK_N >= 64 rows) fills the warpgroup MMA's 64-row side and the few
    token rows its narrow side (fp8 wgmma from BLOCK_M 16; without it BLOCK_M < 64 falls
    back to mma.sync on fp8 converted to fp16).
    FIXUP (split-K with SwiGLU fused): each split adds its partial sums atomically into
    ``out`` (fp32, zero before the call), then counts itself in ``arrived`` (one counter
    per row block and column block); the split that arrives last reads the sums, applies
    SwiGLU and the quantisation, and zeroes the sums and the counter for the next call.
    """
    pid_m, pid_n = _tile_ids(COLUMNS_FIRST)
    pid_k = tl.program_id(2)
    if CLEAR:
        program = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + pid_k
        first = program.to(tl.int64) * clear_per_program
        for step in range(0, clear_per_program, CLEAR_STEP):
            idx = first + step + tl.arange(0, CLEAR_STEP)
            tl.store(clear_ptr + idx, tl.zeros([CLEAR_STEP], dtype=tl.float32), mask=idx < clear_numel)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= NUM_LOCAL:
        return
    BK: tl.constexpr = 128
    K_BLOCKS: tl.constexpr = HIDDEN // BK
    PER_SPLIT: tl.constexpr = (K_BLOCKS + SPLIT_K - 1) // SPLIT_K
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pair_of_row_ptr + rows)
    row_ok = pair < num_tokens * K
    token = tl.where(row_ok, pair // K, 0).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BK)

    w_expert = w_ptr + expert.to(tl.int64) * (2 * INTER * HIDDEN)
    up_rows = cols.to(tl.int64)
    gate_rows = up_rows + INTER
    # BLOCK_N <= 128 columns lie in one 128-row scale block: one up and one gate scale per K step.
    s_up_row = w_scale_ptr + expert.to(tl.int64) * (2 * INTER // BK) * K_BLOCKS + (pid_n * BLOCK_N // BK) * K_BLOCKS
    s_gate_row = s_up_row + (INTER // BK) * K_BLOCKS

    if SWAP_AB:
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_gate = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    kb_start = pid_k * PER_SPLIT
    kb_end = tl.minimum(kb_start + PER_SPLIT, K_BLOCKS)
    for kb in tl.range(kb_start, kb_end, num_stages=STAGES):
        offs = kb * BK + k
        a_scale = tl.load(a_scale_ptr + kb * num_tokens + token, mask=row_ok, other=0.0)
        s_up = tl.load(s_up_row + kb)
        s_gate = tl.load(s_gate_row + kb)
        if SWAP_AB:
            a = tl.load(a_ptr + token[None, :] * HIDDEN + offs[:, None], mask=row_ok[None, :], other=0.0)
            w_up = tl.load(w_expert + up_rows[:, None] * HIDDEN + offs[None, :])
            w_gate = tl.load(w_expert + gate_rows[:, None] * HIDDEN + offs[None, :])
            acc_up += tl.dot(w_up, a) * (a_scale[None, :] * s_up)
            acc_gate += tl.dot(w_gate, a) * (a_scale[None, :] * s_gate)
        else:
            a = tl.load(a_ptr + token[:, None] * HIDDEN + offs[None, :], mask=row_ok[:, None], other=0.0)
            w_up = tl.load(w_expert + up_rows[None, :] * HIDDEN + offs[:, None])
            w_gate = tl.load(w_expert + gate_rows[None, :] * HIDDEN + offs[:, None])
            acc_up += tl.dot(a, w_up) * (a_scale[:, None] * s_up)
            acc_gate += tl.dot(a, w_gate) * (a_scale[:, None] * s_gate)
    if SWAP_AB:
        acc_up = tl.trans(acc_up)
        acc_gate = tl.trans(acc_gate)

    if SWIGLU_EPILOGUE:
        _swiglu_store(acc_up, acc_gate, rows, row_ok, pid_n, h_ptr, h_scale_ptr, INTER, BLOCK_N, OUT_FP8)
    else:
        rows64 = rows.to(tl.int64)
        up_out = out_ptr + rows64[:, None] * (2 * INTER) + cols[None, :]
        if SPLIT_K == 1:
            tl.store(up_out, acc_up, mask=row_ok[:, None])
            tl.store(up_out + INTER, acc_gate, mask=row_ok[:, None])
        else:
            tl.atomic_add(up_out, acc_up, mask=row_ok[:, None], sem="relaxed")
            tl.atomic_add(up_out + INTER, acc_gate, mask=row_ok[:, None], sem="relaxed")
            if FIXUP:
                tl.debug_barrier()  # every thread's partial sums are added before the count
                counter = arrived_ptr + pid_m * (INTER // BLOCK_N) + pid_n
                if tl.atomic_add(counter, 1, sem="acq_rel") == SPLIT_K - 1:
                    up = tl.load(up_out, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
                    gate = tl.load(up_out + INTER, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
                    _swiglu_store(up, gate, rows, row_ok, pid_n, h_ptr, h_scale_ptr, INTER, BLOCK_N, OUT_FP8)
                    zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                    tl.store(up_out, zero, mask=row_ok[:, None])
                    tl.store(up_out + INTER, zero, mask=row_ok[:, None])
                    tl.store(counter, 0)


@triton.jit
def swiglu_kernel(
    g1_ptr, pair_of_row_ptr, block_expert_ptr, h_ptr, h_scale_ptr, num_tokens,
    INTER: tl.constexpr, K: tl.constexpr, NUM_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, OUT_FP8: tl.constexpr,
):
    """SwiGLU (and quantisation) of GEMM1's fp32 output, when not fused into GEMM1."""
    if tl.load(block_expert_ptr + tl.program_id(0)) >= NUM_LOCAL:
        return
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    col_block = tl.program_id(1)
    pair = tl.load(pair_of_row_ptr + rows)
    row_ok = pair < num_tokens * K
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    base = g1_ptr + rows.to(tl.int64)[:, None] * (2 * INTER) + cols[None, :]
    up = tl.load(base, mask=row_ok[:, None], other=0.0)
    gate = tl.load(base + INTER, mask=row_ok[:, None], other=0.0)
    _swiglu_store(up, gate, rows, row_ok, col_block, h_ptr, h_scale_ptr, INTER, BLOCK_N, OUT_FP8)


# -- 4. GEMM2 ------------------------------------------------------------------------------


@triton.jit
def gemm2_kernel(
    h_ptr, h_scale_ptr, w_ptr, w_scale_ptr, pair_of_row_ptr, block_expert_ptr, weights_ptr,
    out_ptr, num_tokens,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, SPLIT_K: tl.constexpr,
    IN_FP8: tl.constexpr, SWAP_AB: tl.constexpr, ATOMIC_TOKENS: tl.constexpr, STAGES: tl.constexpr,
    COLUMNS_FIRST: tl.constexpr = False,
):
    """Rows of one expert x BLOCK_N hidden columns, times each pair's routing weight.

    Each pipelined K step is one 128-deep weight scale block; with an fp8 intermediate
    quantised in GROUP < 128 columns it is GROUP-deep products, each with its own
    activation scales. SWAP_AB: computed as weights x activations^T (see gemm1_kernel).
    ATOMIC_TOKENS: add into out[token] (fp32 [T, HIDDEN]); else write out[row]
    ([rows, HIDDEN], added atomically when split along K).
    """
    pid_m, pid_n = _tile_ids(COLUMNS_FIRST)
    pid_k = tl.program_id(2)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= NUM_LOCAL:
        return
    BK: tl.constexpr = 128
    SUBS: tl.constexpr = BK // GROUP
    K_STEPS: tl.constexpr = INTER // BK
    PER_SPLIT: tl.constexpr = (K_STEPS + SPLIT_K - 1) // SPLIT_K
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows64 = rows.to(tl.int64)
    pair = tl.load(pair_of_row_ptr + rows)
    row_ok = pair < num_tokens * K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols64 = cols.to(tl.int64)
    g = tl.arange(0, GROUP)
    w_expert = w_ptr + expert.to(tl.int64) * (HIDDEN * INTER)
    s_rows = w_scale_ptr + expert.to(tl.int64) * (HIDDEN // BK) * K_STEPS + (cols // BK) * K_STEPS

    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    step_start = pid_k * PER_SPLIT
    step_end = tl.minimum(step_start + PER_SPLIT, K_STEPS)
    for step in tl.range(step_start, step_end, num_stages=STAGES):
        w_scale = tl.load(s_rows + step)
        for sub in tl.static_range(SUBS):
            offs = step * BK + sub * GROUP + g
            if IN_FP8:
                a_scale = tl.load(h_scale_ptr + rows64 * (INTER // GROUP) + step * SUBS + sub, mask=row_ok, other=0.0)
            if SWAP_AB:
                a = tl.load(h_ptr + rows64[None, :] * INTER + offs[:, None], mask=row_ok[None, :], other=0.0)
                w = tl.load(w_expert + cols64[:, None] * INTER + offs[None, :])
                if IN_FP8:
                    acc += tl.dot(w, a) * (w_scale[:, None] * a_scale[None, :])
                else:
                    acc += tl.dot(w.to(tl.bfloat16), a) * w_scale[:, None]
            else:
                a = tl.load(h_ptr + rows64[:, None] * INTER + offs[None, :], mask=row_ok[:, None], other=0.0)
                w = tl.load(w_expert + cols64[None, :] * INTER + offs[:, None])
                if IN_FP8:
                    acc += tl.dot(a, w) * (a_scale[:, None] * w_scale[None, :])
                else:
                    acc += tl.dot(a, w.to(tl.bfloat16)) * w_scale[None, :]
    if SWAP_AB:
        acc = tl.trans(acc)

    weight = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * weight[:, None]
    if ATOMIC_TOKENS:
        token = tl.where(row_ok, pair // K, 0).to(tl.int64)
        tl.atomic_add(out_ptr + token[:, None] * HIDDEN + cols[None, :], acc, mask=row_ok[:, None], sem="relaxed")
    elif SPLIT_K == 1:
        tl.store(out_ptr + rows64[:, None] * HIDDEN + cols[None, :], acc, mask=row_ok[:, None])
    else:
        tl.atomic_add(out_ptr + rows64[:, None] * HIDDEN + cols[None, :], acc, mask=row_ok[:, None], sem="relaxed")


# -- 5. combine ----------------------------------------------------------------------------


@triton.jit
def combine_kernel(
    rows_ptr, row_of_pair_ptr, out_ptr, HIDDEN: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out[t] = sum over t's local slots of its GEMM2 rows, in slot order; zeros if none."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(K):
        row = tl.load(row_of_pair_ptr + token * K + j)
        acc += tl.load(rows_ptr + row.to(tl.int64) * HIDDEN + cols, mask=(row >= 0) & (cols < HIDDEN), other=0.0)
    tl.store(out_ptr + token * HIDDEN + cols, acc.to(tl.bfloat16), mask=cols < HIDDEN)


# -- the candidate ---------------------------------------------------------------------------


BANDS = ("SMALL", "MID", "LARGE")
"""Token-count bands, each with tile knobs of its own (``<BAND>_<KNOB>``): a batch of up
to SMALL_UP_TO tokens takes the SMALL tiles, up to MID_UP_TO the MID ones, else LARGE."""

TILE_DEFAULTS: dict[str, dict[str, Any]] = {
    "SMALL": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "SPLIT_K1": 4, "SPLIT_K2": 2,
              "SWAP_AB": True, "STAGES": 4, "NUM_WARPS1": 4, "NUM_WARPS2": 4},
    "MID": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 128, "SPLIT_K1": 1, "SPLIT_K2": 1,
            "SWAP_AB": True, "STAGES": 4, "NUM_WARPS1": 4, "NUM_WARPS2": 4},
    "LARGE": {"BLOCK_M": 64, "BLOCK_N1": 128, "BLOCK_N2": 128, "SPLIT_K1": 1, "SPLIT_K2": 1,
              "SWAP_AB": False, "STAGES": 3, "NUM_WARPS1": 8, "NUM_WARPS2": 4},
}
"""The code's defaults of each band's knobs: those of triton_fused.yaml (unmeasured)."""


class Tiles(NamedTuple):
    """The GEMM tiling of one token-count band."""

    block_m: int      # rows per block of both grouped GEMMs (each expert's rows padded to it)
    block_n1: int     # GEMM1: up (and as many gate) columns per program; fp8 quantisation group
    block_n2: int     # GEMM2: hidden columns per program
    split_k1: int     # GEMM1: programs sharing the 56 K blocks
    split_k2: int     # GEMM2: programs sharing the 16 K blocks
    swap_ab: bool     # both GEMMs as weights x activations^T (warpgroup MMA for few rows)
    stages: int       # software pipeline depth of both GEMMs' K loops
    warps1: int
    warps2: int

    @staticmethod
    def of(params: dict[str, Any], band: str) -> Tiles:
        def get(name: str) -> Any:
            return params.get(f"{band}_{name}", TILE_DEFAULTS[band][name])

        tiles = Tiles(int(get("BLOCK_M")), int(get("BLOCK_N1")), int(get("BLOCK_N2")), int(get("SPLIT_K1")),
                      int(get("SPLIT_K2")), bool(get("SWAP_AB")), int(get("STAGES")), int(get("NUM_WARPS1")),
                      int(get("NUM_WARPS2")))
        for name, value, least, most in (("BLOCK_M", tiles.block_m, 16, 256), ("BLOCK_N1", tiles.block_n1, 32, BLOCK),
                                         ("BLOCK_N2", tiles.block_n2, 16, 512)):
            if not least <= value <= most or value & (value - 1):
                raise ValueError(f"{band}_{name} must be a power of two in [{least}, {most}], not {value}")
        if min(tiles.split_k1, tiles.split_k2, tiles.stages) < 1:
            raise ValueError(f"{band}: split-K factors and stages must be >= 1")
        return tiles


class Config:
    """The knob and launch values of one candidate, checked once at build time."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.route_tokens = int(params.get("ROUTE_TOKENS", 16))
        self.one_program_up_to = int(params.get("ONE_PROGRAM_ROUTING_UP_TO", 64))
        self.small_up_to = int(params.get("SMALL_UP_TO", 16))
        self.mid_up_to = int(params.get("MID_UP_TO", 128))
        self.fuse_swiglu = bool(params.get("FUSE_SWIGLU", True))
        self.intermediate_fp8 = str(params.get("INTERMEDIATE", "fp8")) == "fp8"
        self.combine = str(params.get("COMBINE", "atomic"))
        self.clear = str(params.get("CLEAR", "gemm1"))
        self.columns_first = str(params.get("GRID_ORDER", "rows")) == "columns"
        self.bands = {band: Tiles.of(params, band) for band in BANDS}
        if self.combine not in ("atomic", "gather"):
            raise ValueError(f"COMBINE must be atomic or gather, not {self.combine!r}")
        if self.clear not in ("gemm1", "memset"):
            raise ValueError(f"CLEAR must be gemm1 or memset, not {self.clear!r}")
        if self.route_tokens < 1 or self.route_tokens & (self.route_tokens - 1):
            raise ValueError(f"ROUTE_TOKENS must be a power of two, not {self.route_tokens}")
        if min(self.one_program_up_to, self.small_up_to, self.mid_up_to) < 0:
            raise ValueError("ONE_PROGRAM_ROUTING_UP_TO, SMALL_UP_TO and MID_UP_TO must be >= 0")

    def band(self, tokens: int) -> str:
        return "SMALL" if tokens <= self.small_up_to else "MID" if tokens <= self.mid_up_to else "LARGE"

    def tiles(self, tokens: int) -> Tiles:
        return self.bands[self.band(tokens)]

    def epilogue(self, tiles: Tiles) -> bool:
        """SwiGLU in GEMM1's epilogue, with the whole K sum in one program."""
        return self.fuse_swiglu and tiles.split_k1 == 1

    def fixup(self, tiles: Tiles) -> bool:
        """Split-K GEMM1 whose last-arriving split applies SwiGLU (no kernel of its own)."""
        return self.fuse_swiglu and tiles.split_k1 > 1

    def grid(self, row_blocks: int, column_blocks: int, splits: int) -> tuple[int, int, int]:
        """A grouped GEMM's launch grid in GRID_ORDER (see ``_tile_ids``)."""
        if self.columns_first:
            if row_blocks > 65535:
                raise ValueError(f"GRID_ORDER columns puts {row_blocks} row blocks on the grid's "
                                 "second axis (at most 65535)")
            return (column_blocks, row_blocks, splits)
        return (row_blocks, column_blocks, splits)

    def group(self, tiles: Tiles) -> int:
        """Columns per scale of the fp8 intermediate (GEMM1's column block); 128 for bf16."""
        return tiles.block_n1 if self.intermediate_fp8 else BLOCK

    @property
    def clear_in_gemm1(self) -> bool:
        """GEMM1's programs zero the atomic combine buffer (no memset launch)."""
        return self.combine == "atomic" and self.clear == "gemm1"


@dataclass(frozen=True)
class Workspace:
    """The device buffers of one shape, sized for the worst case (every pair local).

    Allocated on a shape's first call and reused by every later call of that shape, so
    that a call allocates nothing and a CUDA graph captured on one call stays valid.
    Every value a call reads is written earlier in the same call, except GEMM1's split-K
    fixup buffers (``g1`` and ``arrived`` with FIXUP), zeroed at allocation and returned
    to zero by the split that uses them.
    """

    local: torch.Tensor         # [T*8] int32: each pair's local expert, num_local if none
    weights: torch.Tensor       # [T*8] fp32: each pair's routing weight
    counts: torch.Tensor        # [token blocks, num_local] int32: pairs per block and expert
    pair_of_row: torch.Tensor   # [max_blocks*BLOCK_M] int32: the pair of each row, T*8 if padding
    block_expert: torch.Tensor  # [max_blocks] int32: the expert of each row block, num_local if unused
    row_of_pair: torch.Tensor   # [T*8] int32: the row of each pair, -1 if not local
    h: torch.Tensor             # [rows, I] fp8 or bf16: the SwiGLU output
    h_scale: torch.Tensor       # [rows, I/BLOCK_N1] fp32 (fp8 intermediate), else unused
    g1: torch.Tensor            # [rows, 2I] fp32 GEMM1 output when SwiGLU is not its epilogue
    arrived: torch.Tensor       # [max_blocks * I/BLOCK_N1] int32: splits done per tile (FIXUP)
    target: torch.Tensor        # fp32 [T, H] (atomic combine) or [rows, H] (gather)

    @property
    def route_blocks(self) -> int:
        return int(self.counts.shape[0])

    @property
    def max_blocks(self) -> int:
        return int(self.block_expert.numel())

    @staticmethod
    def allocate(cfg: Config, tokens: int, hidden: int, inter: int, num_local: int,
                 device: torch.device) -> Workspace:
        if num_local & (num_local - 1):
            raise ValueError(f"the kernels need a power-of-two number of local experts, not {num_local}")
        tiles = cfg.tiles(tokens)
        if inter % tiles.block_n1 or hidden % BLOCK or inter % BLOCK:
            raise ValueError(f"{tiles} does not tile hidden {hidden}, intermediate {inter}")
        pairs = tokens * TOP_K
        max_blocks = triton.cdiv(pairs + min(num_local, pairs) * (tiles.block_m - 1), tiles.block_m)
        rows = max_blocks * tiles.block_m

        def empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        if cfg.intermediate_fp8:
            h, h_scale = empty(rows, inter, dtype=torch.float8_e4m3fn), empty(rows, inter // tiles.block_n1)
        else:
            h, h_scale = empty(rows, inter, dtype=torch.bfloat16), empty(1)
        fixup = cfg.fixup(tiles)
        if fixup:
            g1 = torch.zeros(rows, 2 * inter, device=device)
            arrived = torch.zeros(max_blocks * (inter // tiles.block_n1), dtype=torch.int32, device=device)
        else:
            g1 = empty(1) if cfg.epilogue(tiles) else empty(rows, 2 * inter)
            arrived = empty(1, dtype=torch.int32)
        return Workspace(
            local=empty(pairs, dtype=torch.int32),
            weights=empty(pairs),
            counts=empty(triton.cdiv(tokens, cfg.route_tokens), num_local, dtype=torch.int32),
            pair_of_row=empty(rows, dtype=torch.int32),
            block_expert=empty(max_blocks, dtype=torch.int32),
            row_of_pair=empty(pairs, dtype=torch.int32),
            h=h,
            h_scale=h_scale,
            g1=g1,
            arrived=arrived,
            target=empty(tokens, hidden) if cfg.combine == "atomic" else empty(rows, hidden),
        )


def route_and_align(
    cfg: Config, ws: Workspace, routing_logits: torch.Tensor, routing_bias: torch.Tensor,
    routed_scaling_factor: torch.Tensor, local_expert_offset: torch.Tensor,
) -> None:
    """Launch stage 1: fills ``ws.local``, ``ws.weights``, ``ws.pair_of_row``,
    ``ws.block_expert`` and ``ws.row_of_pair`` for these routing inputs (one launch up to
    ``ONE_PROGRAM_ROUTING_UP_TO`` tokens, two above)."""
    tokens, num_experts = routing_logits.shape
    num_local = ws.counts.shape[1]
    block_m = cfg.tiles(tokens).block_m
    routing_args = (routing_logits, routing_bias, routed_scaling_factor, local_expert_offset,
                    ws.local, ws.weights)
    routing_consts = dict(NUM_EXPERTS=num_experts, NUM_LOCAL=num_local, GROUPS=NUM_GROUPS,
                          KEEP_GROUPS=TOPK_GROUPS, K=TOP_K, TOKENS=cfg.route_tokens)
    if tokens <= cfg.one_program_up_to:
        route_align_kernel[(1,)](
            *routing_args, ws.pair_of_row, ws.block_expert, ws.row_of_pair, tokens, ws.max_blocks,
            **routing_consts, BLOCK_M=block_m, LABEL=LABEL_BLOCKS,
        )
    else:
        route_kernel[(ws.route_blocks,)](*routing_args, ws.counts, tokens, **routing_consts)
        align_kernel[(ws.route_blocks,)](
            ws.local, ws.counts, ws.pair_of_row, ws.block_expert, ws.row_of_pair, tokens,
            ws.max_blocks, NUM_LOCAL=num_local, K=TOP_K, TOKENS=cfg.route_tokens,
            BLOCK_M=block_m, LABEL=LABEL_BLOCKS, COUNT_ROWS=COUNT_ROWS,
        )


def device_scalar(value: Any, dtype: torch.dtype, device: torch.device,
                  made: dict[tuple[Any, ...], torch.Tensor]) -> torch.Tensor:
    """A scalar input as the kernels load it: a tensor on ``device`` as it is; a Python
    number or a host tensor (the FlashInfer-Bench harness passes scalars as numbers) as a
    one-element tensor on ``device``, made once per value (so not under graph capture)."""
    if isinstance(value, torch.Tensor) and value.device == device:
        return value
    number = value.item() if isinstance(value, torch.Tensor) else value
    key = (device, dtype, number)
    if key not in made:
        made[key] = torch.tensor([number], dtype=dtype, device=device)
    return made[key]


def build(params: dict, kernels: object = None) -> Callable[..., None]:
    del kernels
    cfg = Config(params)
    workspaces: dict[tuple[Any, ...], Workspace] = {}
    scalars: dict[tuple[Any, ...], torch.Tensor] = {}

    def run(
        routing_logits: torch.Tensor,
        routing_bias: torch.Tensor,
        hidden_states: torch.Tensor,
        hidden_states_scale: torch.Tensor,
        gemm1_weights: torch.Tensor,
        gemm1_weights_scale: torch.Tensor,
        gemm2_weights: torch.Tensor,
        gemm2_weights_scale: torch.Tensor,
        local_expert_offset: torch.Tensor,
        routed_scaling_factor: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        tokens, hidden = hidden_states.shape
        num_local, inter = gemm2_weights.shape[0], gemm2_weights.shape[2]
        key = (hidden_states.device, tokens, hidden, inter, num_local)
        ws = workspaces.get(key)
        if ws is None:
            ws = workspaces[key] = Workspace.allocate(cfg, tokens, hidden, inter, num_local,
                                                      hidden_states.device)
        tiles = cfg.tiles(tokens)
        device = hidden_states.device
        route_and_align(cfg, ws, routing_logits, routing_bias,
                        device_scalar(routed_scaling_factor, torch.float32, device, scalars),
                        device_scalar(local_expert_offset, torch.int32, device, scalars))

        epilogue, fixup = cfg.epilogue(tiles), cfg.fixup(tiles)
        if not cfg.fuse_swiglu and tiles.split_k1 > 1:
            ws.g1.zero_()  # split-K partials are added atomically
        grid1 = cfg.grid(ws.max_blocks, inter // tiles.block_n1, tiles.split_k1)
        clear_numel = ws.target.numel() if cfg.clear_in_gemm1 else 0
        programs = grid1[0] * grid1[1] * grid1[2]
        clear_per_program = triton.cdiv(triton.cdiv(clear_numel, programs), CLEAR_STEP) * CLEAR_STEP
        gemm1_kernel[grid1](
            hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
            ws.pair_of_row, ws.block_expert, ws.g1, ws.h, ws.h_scale, ws.target, ws.arrived, tokens,
            clear_numel, clear_per_program,
            HIDDEN=hidden, INTER=inter, K=TOP_K, NUM_LOCAL=num_local,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n1, SPLIT_K=tiles.split_k1,
            SWIGLU_EPILOGUE=epilogue, FIXUP=fixup, SWAP_AB=tiles.swap_ab, OUT_FP8=cfg.intermediate_fp8,
            STAGES=tiles.stages, CLEAR=cfg.clear_in_gemm1, CLEAR_STEP=CLEAR_STEP,
            COLUMNS_FIRST=cfg.columns_first, num_warps=tiles.warps1,
        )
        if not cfg.fuse_swiglu:
            swiglu_kernel[(ws.max_blocks, inter // tiles.block_n1)](
                ws.g1, ws.pair_of_row, ws.block_expert, ws.h, ws.h_scale, tokens,
                INTER=inter, K=TOP_K, NUM_LOCAL=num_local, BLOCK_M=tiles.block_m,
                BLOCK_N=tiles.block_n1, OUT_FP8=cfg.intermediate_fp8, num_warps=4,
            )

        atomic = cfg.combine == "atomic"
        if (atomic and not cfg.clear_in_gemm1) or (not atomic and tiles.split_k2 > 1):
            ws.target.zero_()  # GEMM2 adds into it
        gemm2_kernel[cfg.grid(ws.max_blocks, triton.cdiv(hidden, tiles.block_n2), tiles.split_k2)](
            ws.h, ws.h_scale, gemm2_weights, gemm2_weights_scale, ws.pair_of_row, ws.block_expert,
            ws.weights, ws.target, tokens,
            HIDDEN=hidden, INTER=inter, K=TOP_K, NUM_LOCAL=num_local,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n2, GROUP=cfg.group(tiles), SPLIT_K=tiles.split_k2,
            IN_FP8=cfg.intermediate_fp8, SWAP_AB=tiles.swap_ab, ATOMIC_TOKENS=atomic, STAGES=tiles.stages,
            COLUMNS_FIRST=cfg.columns_first, num_warps=tiles.warps2,
        )
        if atomic:
            output.copy_(ws.target)
        else:
            combine_kernel[(tokens, triton.cdiv(hidden, 512))](
                ws.target, ws.row_of_pair, output, HIDDEN=hidden, K=TOP_K, BLOCK_N=512,
            )

    return run


# -- ahead-of-time compilation (no GPU needed) ---------------------------------------------


def compile_kernels(params: dict, target: Any, band: str = "LARGE", hidden: int = 7168,
                    inter: int = 2048) -> dict[str, Any]:
    """Compile every kernel one configuration may launch for a batch in ``band``, for
    ``target`` (a GPUTarget), as the launcher specialises them at full width (every
    pointer 16-byte aligned).

    Returns kernel name -> compiled kernel (its ``asm`` and ``metadata``). Raises what
    the compiler raises for a configuration that does not fit the target.
    """
    from triton.compiler import ASTSource

    cfg = Config(params)
    tiles = cfg.bands[band]
    h_type = "*fp8e4nv" if cfg.intermediate_fp8 else "*bf16"
    routing_types = {"logits_ptr": "*fp32", "bias_ptr": "*bf16", "factor_ptr": "*fp32",
                     "offset_ptr": "*i32", "local_ptr": "*i32", "weights_ptr": "*fp32"}
    routing_consts = {"NUM_EXPERTS": 256, "NUM_LOCAL": 32, "GROUPS": NUM_GROUPS,
                      "KEEP_GROUPS": TOPK_GROUPS, "K": TOP_K, "TOKENS": cfg.route_tokens}
    layout_types = {"pair_of_row_ptr": "*i32", "block_expert_ptr": "*i32", "row_of_pair_ptr": "*i32"}
    jobs: dict[str, tuple[Any, dict[str, str], dict[str, Any], int]] = {
        "route_align_kernel": (
            route_align_kernel,
            {**routing_types, **layout_types, "num_tokens": "i32", "max_blocks": "i32"},
            {**routing_consts, "BLOCK_M": tiles.block_m, "LABEL": LABEL_BLOCKS},
            4,
        ),
        "route_kernel": (
            route_kernel,
            {**routing_types, "counts_ptr": "*i32", "num_tokens": "i32"},
            routing_consts,
            4,
        ),
        "align_kernel": (
            align_kernel,
            {"local_ptr": "*i32", "counts_ptr": "*i32", **layout_types, "num_tokens": "i32",
             "max_blocks": "i32"},
            {"NUM_LOCAL": 32, "K": TOP_K, "TOKENS": cfg.route_tokens, "BLOCK_M": tiles.block_m,
             "LABEL": LABEL_BLOCKS, "COUNT_ROWS": COUNT_ROWS},
            4,
        ),
        "gemm1_kernel": (
            gemm1_kernel,
            {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
             "pair_of_row_ptr": "*i32", "block_expert_ptr": "*i32", "out_ptr": "*fp32", "h_ptr": h_type,
             "h_scale_ptr": "*fp32", "clear_ptr": "*fp32", "arrived_ptr": "*i32", "num_tokens": "i32",
             "clear_numel": "i32", "clear_per_program": "i32"},
            {"HIDDEN": hidden, "INTER": inter, "K": TOP_K, "NUM_LOCAL": 32, "BLOCK_M": tiles.block_m,
             "BLOCK_N": tiles.block_n1, "SPLIT_K": tiles.split_k1, "SWIGLU_EPILOGUE": cfg.epilogue(tiles),
             "FIXUP": cfg.fixup(tiles), "SWAP_AB": tiles.swap_ab, "OUT_FP8": cfg.intermediate_fp8,
             "STAGES": tiles.stages, "CLEAR": cfg.clear_in_gemm1, "CLEAR_STEP": CLEAR_STEP},
            tiles.warps1,
        ),
        "gemm2_kernel": (
            gemm2_kernel,
            {"h_ptr": h_type, "h_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
             "pair_of_row_ptr": "*i32", "block_expert_ptr": "*i32", "weights_ptr": "*fp32",
             "out_ptr": "*fp32", "num_tokens": "i32"},
            {"HIDDEN": hidden, "INTER": inter, "K": TOP_K, "NUM_LOCAL": 32, "BLOCK_M": tiles.block_m,
             "BLOCK_N": tiles.block_n2, "GROUP": cfg.group(tiles), "SPLIT_K": tiles.split_k2,
             "IN_FP8": cfg.intermediate_fp8, "SWAP_AB": tiles.swap_ab,
             "ATOMIC_TOKENS": cfg.combine == "atomic", "STAGES": tiles.stages},
            tiles.warps2,
        ),
    }
    if not cfg.fuse_swiglu:
        jobs["swiglu_kernel"] = (
            swiglu_kernel,
            {"g1_ptr": "*fp32", "pair_of_row_ptr": "*i32", "block_expert_ptr": "*i32", "h_ptr": h_type,
             "h_scale_ptr": "*fp32", "num_tokens": "i32"},
            {"INTER": inter, "K": TOP_K, "NUM_LOCAL": 32, "BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n1,
             "OUT_FP8": cfg.intermediate_fp8},
            4,
        )
    if cfg.combine == "gather":
        jobs["combine_kernel"] = (
            combine_kernel,
            {"rows_ptr": "*fp32", "row_of_pair_ptr": "*i32", "out_ptr": "*bf16"},
            {"HIDDEN": hidden, "K": TOP_K, "BLOCK_N": 512},
            4,
        )
    compiled = {}
    for name, (fn, signature, constexprs, warps) in jobs.items():
        # The launcher marks 16-byte aligned pointers (all of these at full width) divisible
        # by 16; without that the compiler loads the tiles byte by byte and does not pipeline them.
        attrs = {(fn.arg_names.index(arg),): [["tt.divisibility", 16]]
                 for arg, kind in signature.items() if kind.startswith("*")}
        signature = {**signature, **{c: "constexpr" for c in constexprs}}
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled[name] = triton.compile(source, target=target, options={"num_warps": warps})
    return compiled
