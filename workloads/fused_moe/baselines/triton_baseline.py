"""The fused-MoE pipeline a user of SGLang-style Triton MoE kernels runs, for this rank.

A baseline, not a seed: no knobs, never a search's starting point. It exists to answer
"how much faster than what people deploy is what the search found?". It follows the
design of the Triton fused-MoE path of the SGLang and vLLM serving engines (written
here from that design, not from their code) for FP8 weights with 128x128 block scales:

1. Routing (one program per ``ROUTE_TOKENS`` tokens): DeepSeek's no-aux rule as the
   definition states it. Sigmoid scores; the bias is added for selection only; a
   group's score is the sum of its two best biased scores; the best 4 of 8 groups are
   kept; the best 8 experts in them are chosen; the weights are the chosen experts'
   unbiased scores, normalised, times ``routed_scaling_factor``. Expert parallelism:
   a pair (token, slot) whose expert is on another rank goes to an extra bucket (the
   engines' ``-1`` expert id), which every GEMM block of that bucket answers with zeros.
2. Block alignment, the engines' ``moe_align_block_size``: the pairs, all of them, are
   sorted by bucket (32 local experts, then the other-rank bucket) into runs padded to a
   multiple of ``BLOCK_M`` rows, so that each row block belongs to one bucket. One
   program counts the buckets, lays out the runs, labels every row block with its
   expert (-1 for the other-rank bucket) and marks the padding rows; then programs over
   chunks of pairs place each pair in its bucket's run by an atomic increment of the
   bucket's cursor (the order within a run is not fixed; the result does not depend
   on it: each pair has a row of its own in both GEMMs' outputs).
3. Grouped GEMM 1 (``fused_moe_kernel``-style): per row block and ``BLOCK_N`` output
   columns of the expert's [4096, 7168] matrix, FP8 x FP8 on the tensor cores with
   fp32 accumulation, each 128-deep K step scaled by the activation's per-token,
   per-128-channel scale and the weight's 128x128 block scale. The activations are the
   definition's FP8 ones with their [56, T] scales read in place (the engines quantise
   bf16 activations per token and 128 channels first; here that is the input already).
   Output: bf16 [T*8, 4096], one row per pair.
4. SiLU-and-mul over every pair's row: ``silu(gate) * up`` in bf16, where, as the
   definition says, the first half of GEMM 1's output is ``up`` and the second ``gate``
   (the engines' weights put gate first; a user converting these weights would keep
   this layout and read the halves the other way round, at the same cost).
5. Per-token-group FP8 quantisation of that [T*8, 2048] bf16 result: one scale per
   pair and 128 columns, ``amax / 448``.
6. Grouped GEMM 2: the same kernel over the expert's [7168, 2048] matrix, each row
   times its pair's routing weight, into bf16 [T*8, 7168].
7. Sum over each token's 8 slots (``moe_sum``), in fp32, into the bf16 output.

Tile sizes come from a table keyed by the batch's token count (the key nearest the
batch's), the way the engines key their tuned per-device JSON tables for one (E, N, K,
dtype, block shape); the same configuration serves both GEMMs. The values below are
plausible H200 choices in the shape of those tables for E=32, N=2048, K=7168, FP8
128x128 blocks: they are unmeasured, not tuned here.

A call issues device work only: every grid and buffer size follows from the shapes
(buffers for the worst case, allocated on a shape's first call and reused), and the
GEMM programs read the padded row count from the device, those past it exiting at
once; so a call can be captured in a CUDA graph. 8 launches (7 kernels) a call.
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
BUCKETS = 64
"""Power-of-two width of the bucket vectors (32 local experts + the other-rank bucket)."""
ROUTE_TOKENS = 16
COUNT_CHUNK = 4096
SORT_CHUNK = 256
LABEL_CHUNK = 256
SUM_COLUMNS = 1024
SILU_COLUMNS = 1024


class GemmConfig(NamedTuple):
    """Launch configuration of both grouped GEMMs (and the alignment's BLOCK_M)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


# Batch tokens -> configuration of both grouped GEMMs (and BLOCK_M of the alignment).
# Unmeasured: plausible H200 values in the shape of the engines' tuned tables.
CONFIGS: dict[int, GemmConfig] = {
    1: GemmConfig(16, 64, 128, 1, 4, 4),
    2: GemmConfig(16, 64, 128, 1, 4, 4),
    4: GemmConfig(16, 64, 128, 1, 4, 4),
    8: GemmConfig(16, 64, 128, 1, 4, 4),
    16: GemmConfig(16, 64, 128, 1, 4, 3),
    24: GemmConfig(16, 128, 128, 1, 4, 3),
    32: GemmConfig(16, 128, 128, 1, 4, 3),
    48: GemmConfig(16, 128, 128, 1, 4, 3),
    64: GemmConfig(16, 128, 128, 1, 4, 3),
    96: GemmConfig(32, 128, 128, 16, 4, 3),
    128: GemmConfig(32, 128, 128, 16, 4, 3),
    256: GemmConfig(64, 128, 128, 16, 4, 3),
    512: GemmConfig(64, 128, 128, 32, 4, 3),
    1024: GemmConfig(64, 128, 128, 32, 4, 3),
    1536: GemmConfig(64, 128, 128, 32, 4, 3),
    2048: GemmConfig(64, 128, 128, 64, 4, 3),
    3072: GemmConfig(64, 128, 128, 64, 4, 3),
    4096: GemmConfig(64, 128, 128, 64, 4, 3),
}


def config_for(tokens: int) -> GemmConfig:
    """The table's entry whose key is nearest ``tokens`` (the smaller key on a tie)."""
    return CONFIGS[min(CONFIGS, key=lambda key: (abs(key - tokens), key))]


# -- 1. routing --------------------------------------------------------------------------------


@triton.jit
def route_kernel(
    logits_ptr, bias_ptr, factor_ptr, offset_ptr, bucket_ptr, weight_ptr, num_tokens,
    NUM_EXPERTS: tl.constexpr, NUM_LOCAL: tl.constexpr, GROUPS: tl.constexpr,
    KEEP_GROUPS: tl.constexpr, K: tl.constexpr, TOKENS: tl.constexpr,
):
    """Each pair's bucket (local expert, or NUM_LOCAL for another rank's) and weight."""
    PER_GROUP: tl.constexpr = NUM_EXPERTS // GROUPS
    token = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    valid = token < num_tokens
    expert = tl.arange(0, NUM_EXPERTS)
    logit = tl.load(logits_ptr + token[:, None].to(tl.int64) * NUM_EXPERTS + expert[None, :],
                    mask=valid[:, None], other=0.0)
    score = 1.0 / (1.0 + tl.exp(-logit))
    choice = score + tl.load(bias_ptr + expert).to(tl.float32)[None, :]

    # Group score: the sum of a group's two best biased scores.
    by_group = tl.reshape(choice, (TOKENS, GROUPS, PER_GROUP))
    member = tl.arange(0, PER_GROUP)[None, None, :]
    top = tl.max(by_group, axis=2)
    top_at = tl.argmax(by_group, axis=2)
    runner_up = tl.max(tl.where(member == top_at[:, :, None], float("-inf"), by_group), axis=2)
    group_score = top + runner_up

    # Keep the best KEEP_GROUPS groups; the experts of the others cannot be chosen.
    group = tl.arange(0, GROUPS)[None, :]
    kept = tl.zeros([TOKENS, GROUPS], dtype=tl.int32)
    for _ in tl.static_range(KEEP_GROUPS):
        best = tl.argmax(tl.where(kept != 0, float("-inf"), group_score), axis=1)
        kept = tl.where(group == best[:, None], 1, kept)
    kept_expert = tl.reshape(tl.broadcast_to(kept[:, :, None], (TOKENS, GROUPS, PER_GROUP)),
                             (TOKENS, NUM_EXPERTS))
    choice = tl.where(kept_expert != 0, choice, float("-inf"))

    # The K best experts of the kept groups, and their unbiased scores.
    slot = tl.arange(0, K)[None, :]
    chosen = tl.zeros([TOKENS, K], dtype=tl.int32)
    chosen_score = tl.zeros([TOKENS, K], dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.argmax(choice, axis=1)
        is_best = expert[None, :] == best[:, None]
        chosen = tl.where(slot == j, best[:, None], chosen)
        chosen_score = tl.where(slot == j, tl.sum(tl.where(is_best, score, 0.0), axis=1)[:, None], chosen_score)
        choice = tl.where(is_best, float("-inf"), choice)
    weight = chosen_score / (tl.sum(chosen_score, axis=1)[:, None] + 1e-20) * tl.load(factor_ptr)

    local = chosen - tl.load(offset_ptr)
    bucket = tl.where((local >= 0) & (local < NUM_LOCAL), local, NUM_LOCAL)
    pair = token[:, None].to(tl.int64) * K + slot
    tl.store(bucket_ptr + pair, bucket, mask=valid[:, None])
    tl.store(weight_ptr + pair, weight, mask=valid[:, None])


# -- 2. block alignment ------------------------------------------------------------------------


@triton.jit
def align_kernel(
    bucket_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr, cursor_ptr, num_pairs, max_blocks,
    NUM_LOCAL: tl.constexpr, BUCKETS: tl.constexpr, BLOCK_M: tl.constexpr,
    COUNT_CHUNK: tl.constexpr, LABEL_CHUNK: tl.constexpr,
):
    """One program: bucket sizes, padded runs, each run's first row (the cursors the
    sort kernel advances), the padded row count, row block labels and padding marks."""
    counts = tl.zeros([BUCKETS], dtype=tl.int32)
    for start in range(0, num_pairs, COUNT_CHUNK):
        pair = start + tl.arange(0, COUNT_CHUNK)
        inside = pair < num_pairs
        bucket = tl.load(bucket_ptr + pair, mask=inside, other=0)
        counts += tl.histogram(bucket, BUCKETS, mask=inside)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    run_end = tl.cumsum(padded, axis=0)
    run_start = run_end - padded
    tl.store(cursor_ptr + tl.arange(0, BUCKETS), run_start)
    tl.store(post_pad_ptr, tl.sum(padded, axis=0))

    # Padding rows: after each run's pairs, up to its padded end; they hold num_pairs.
    j = tl.arange(0, BLOCK_M)[None, :]
    tl.store(sorted_ptr + (run_start + counts)[:, None] + j,
             tl.zeros([BUCKETS, BLOCK_M], dtype=tl.int32) + num_pairs,
             mask=(counts[:, None] + j) < padded[:, None])

    # Row block b belongs to the bucket whose run covers it; -1 for the other ranks'.
    block_end = run_end // BLOCK_M
    for start in range(0, max_blocks, LABEL_CHUNK):
        b = start + tl.arange(0, LABEL_CHUNK)
        bucket = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + b, tl.where(bucket < NUM_LOCAL, bucket, -1), mask=b < max_blocks)


@triton.jit
def sort_kernel(bucket_ptr, cursor_ptr, sorted_ptr, num_pairs, CHUNK: tl.constexpr):
    """Place each pair of this chunk in its bucket's run: an atomic increment of the
    bucket's cursor gives the pair its row (one atomic per pair, as the engines do)."""
    pair = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    inside = pair < num_pairs
    bucket = tl.load(bucket_ptr + pair, mask=inside, other=0)
    row = tl.atomic_add(cursor_ptr + bucket, 1, mask=inside, sem="relaxed")
    tl.store(sorted_ptr + row, pair.to(tl.int32), mask=inside)


# -- 3 and 6. grouped GEMM ---------------------------------------------------------------------


@triton.jit
def moe_gemm_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, weight_ptr, sorted_ptr, expert_ids_ptr, post_pad_ptr,
    num_pairs, padded_rows,
    stride_am, stride_asm, stride_ask, stride_be, stride_bn, stride_bse, stride_bsn, stride_cm,
    N: tl.constexpr, K: tl.constexpr, ROWS_PER_A: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,
):
    """C[pair, :] = A[pair // ROWS_PER_A, :] @ B[expert].T, block-scaled FP8 (128 x 128 weight
    blocks, per-row 128-wide activation groups), optionally times the pair's weight.

    B is [experts, N, K] (K contiguous); A rows are tokens (GEMM 1: ROWS_PER_A = 8) or pairs
    (GEMM 2: 1). A row block labelled -1 (another rank's pairs) writes zeros."""
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(padded_rows, BLOCK_M)
    blocks_n: tl.constexpr = N // BLOCK_N
    in_group = GROUP_M * blocks_n
    first_m = pid // in_group * GROUP_M
    group_rows = tl.minimum(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    if pid_m * BLOCK_M >= tl.load(post_pad_ptr):
        return

    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    real = pair < num_pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    expert = tl.load(expert_ids_ptr + pid_m)
    if expert < 0:
        tl.store(c_ptrs, tl.zeros([BLOCK_M, BLOCK_N], dtype=c_ptr.dtype.element_ty), mask=real[:, None])
        return

    a_row = tl.where(real, pair // ROWS_PER_A, 0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + k[None, :]
    b_ptrs = b_ptr + expert.to(tl.int64) * stride_be + cols.to(tl.int64)[None, :] * stride_bn + k[:, None]
    a_scale_ptrs = a_scale_ptr + a_row * stride_asm
    b_scale_ptrs = b_scale_ptr + expert.to(tl.int64) * stride_bse + (cols // 128) * stride_bsn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in tl.range(0, K // BLOCK_K, num_stages=STAGES):
        a = tl.load(a_ptrs, mask=real[:, None], other=0.0)
        b = tl.load(b_ptrs)
        group_k = step * BLOCK_K // 128
        a_scale = tl.load(a_scale_ptrs + group_k * stride_ask, mask=real, other=0.0)
        b_scale = tl.load(b_scale_ptrs + group_k)
        acc += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    if MUL_WEIGHT:
        acc = acc * tl.load(weight_ptr + pair, mask=real, other=0.0)[:, None]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=real[:, None])


# -- 4, 5 and 7. element-wise stages -----------------------------------------------------------


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, INTER: tl.constexpr, COLUMNS: tl.constexpr):
    """out[r] = silu(gate) * up for row r of [rows, 2 * INTER] = [up | gate], in bf16."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    inside = cols < INTER
    up = tl.load(x_ptr + row * 2 * INTER + cols, mask=inside, other=0.0).to(tl.float32)
    gate = tl.load(x_ptr + row * 2 * INTER + INTER + cols, mask=inside, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * INTER + cols, (silu * up).to(tl.bfloat16), mask=inside)


@triton.jit
def group_quant_kernel(x_ptr, q_ptr, scale_ptr, INTER: tl.constexpr, GROUP: tl.constexpr):
    """Row r of bf16 [rows, INTER] to FP8, one scale (amax / 448) per GROUP columns."""
    GROUPS: tl.constexpr = INTER // GROUP
    row = tl.program_id(0).to(tl.int64)
    x = tl.load(x_ptr + row * INTER + tl.arange(0, INTER)).to(tl.float32)
    x = tl.reshape(x, (GROUPS, GROUP))
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / 448.0
    q = tl.clamp(x / scale[:, None], -448.0, 448.0).to(tl.float8e4nv)
    tl.store(q_ptr + row * INTER + tl.arange(0, INTER), tl.reshape(q, (INTER,)))
    tl.store(scale_ptr + row * GROUPS + tl.arange(0, GROUPS), scale)


@triton.jit
def moe_sum_kernel(x_ptr, out_ptr, HIDDEN: tl.constexpr, K: tl.constexpr, COLUMNS: tl.constexpr):
    """out[t] = sum over t's K slots of their GEMM 2 rows, in fp32, to bf16."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    inside = cols < HIDDEN
    acc = tl.zeros([COLUMNS], dtype=tl.float32)
    for j in tl.static_range(K):
        acc += tl.load(x_ptr + (token * K + j) * HIDDEN + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * HIDDEN + cols, acc.to(tl.bfloat16), mask=inside)


# -- the pipeline ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workspace:
    """One shape's buffers, worst-case sized (every bucket's run padded), reused by every
    call of that shape; every value a call reads is written earlier in the same call."""

    bucket: torch.Tensor       # [T*8] int32: each pair's local expert, NUM_LOCAL if another rank's
    weight: torch.Tensor       # [T*8] fp32: each pair's routing weight
    cursor: torch.Tensor       # [BUCKETS] int32: next free row of each bucket's run
    post_pad: torch.Tensor     # [1] int32: rows in use (all runs, padded)
    sorted_ids: torch.Tensor   # [padded rows] int32: the pair of each row, T*8 for padding
    expert_ids: torch.Tensor   # [padded rows / BLOCK_M] int32: each row block's expert, -1 for others'
    gemm1: torch.Tensor        # [T*8, 2I] bf16
    act: torch.Tensor          # [T*8, I] bf16: SiLU-and-mul
    act_q: torch.Tensor        # [T*8, I] fp8
    act_scale: torch.Tensor    # [T*8, I/128] fp32
    gemm2: torch.Tensor        # [T*8, H] bf16: each pair's weighted expert output

    @staticmethod
    def allocate(cfg: GemmConfig, tokens: int, hidden: int, inter: int, num_local: int,
                 device: torch.device) -> Workspace:
        pairs = tokens * TOP_K
        rows = pairs + (num_local + 1) * (cfg.block_m - 1)
        rows = triton.cdiv(rows, cfg.block_m) * cfg.block_m

        def empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        return Workspace(
            bucket=empty(pairs, dtype=torch.int32),
            weight=empty(pairs),
            cursor=empty(BUCKETS, dtype=torch.int32),
            post_pad=empty(1, dtype=torch.int32),
            sorted_ids=empty(rows, dtype=torch.int32),
            expert_ids=empty(rows // cfg.block_m, dtype=torch.int32),
            gemm1=empty(pairs, 2 * inter, dtype=torch.bfloat16),
            act=empty(pairs, inter, dtype=torch.bfloat16),
            act_q=empty(pairs, inter, dtype=torch.float8_e4m3fn),
            act_scale=empty(pairs, inter // BLOCK),
            gemm2=empty(pairs, hidden, dtype=torch.bfloat16),
        )


def route_and_align(
    cfg: GemmConfig, ws: Workspace, num_local: int, routing_logits: torch.Tensor,
    routing_bias: torch.Tensor, local_expert_offset: torch.Tensor, routed_scaling_factor: torch.Tensor,
) -> None:
    """Stages 1 and 2 (3 launches): fills bucket, weight, cursor, post_pad, sorted_ids, expert_ids."""
    tokens, num_experts = routing_logits.shape
    pairs = tokens * TOP_K
    route_kernel[(triton.cdiv(tokens, ROUTE_TOKENS),)](
        routing_logits, routing_bias, routed_scaling_factor, local_expert_offset, ws.bucket, ws.weight,
        tokens, NUM_EXPERTS=num_experts, NUM_LOCAL=num_local, GROUPS=NUM_GROUPS,
        KEEP_GROUPS=TOPK_GROUPS, K=TOP_K, TOKENS=ROUTE_TOKENS,
    )
    align_kernel[(1,)](
        ws.bucket, ws.sorted_ids, ws.expert_ids, ws.post_pad, ws.cursor, pairs, ws.expert_ids.numel(),
        NUM_LOCAL=num_local, BUCKETS=BUCKETS, BLOCK_M=cfg.block_m, COUNT_CHUNK=COUNT_CHUNK,
        LABEL_CHUNK=LABEL_CHUNK, num_warps=8,
    )
    sort_kernel[(triton.cdiv(pairs, SORT_CHUNK),)](
        ws.bucket, ws.cursor, ws.sorted_ids, pairs, CHUNK=SORT_CHUNK, num_warps=4,
    )


def grouped_gemm(
    cfg: GemmConfig, ws: Workspace, a: torch.Tensor, a_scale: torch.Tensor, a_scale_strides: tuple[int, int],
    b: torch.Tensor, b_scale: torch.Tensor, c: torch.Tensor, rows_per_a: int, mul_weight: bool,
) -> None:
    """Stage 3 or 6: one launch over every possible row block (those past the padded row
    count exit at once) and output column block, grouped GROUP_M row blocks at a time."""
    n, k = b.shape[1], b.shape[2]
    if n % cfg.block_n or k % cfg.block_k or BLOCK % cfg.block_k:
        raise ValueError(f"{cfg} does not tile a [{n}, {k}] expert matrix in 128-wide scale blocks")
    rows = ws.sorted_ids.numel()
    grid = (triton.cdiv(rows, cfg.block_m) * (n // cfg.block_n),)
    moe_gemm_kernel[grid](
        a, a_scale, b, b_scale, c, ws.weight, ws.sorted_ids, ws.expert_ids, ws.post_pad,
        ws.bucket.numel(), rows,
        a.stride(0), a_scale_strides[0], a_scale_strides[1], b.stride(0), b.stride(1),
        b_scale.stride(0), b_scale.stride(1), c.stride(0),
        N=n, K=k, ROWS_PER_A=rows_per_a, MUL_WEIGHT=mul_weight,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        STAGES=cfg.num_stages, num_warps=cfg.num_warps,
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


class Pipeline:
    """The whole call; ``config`` overrides the table (the tests run several entries)."""

    def __init__(self, config: GemmConfig | None = None) -> None:
        self.config = config
        self.workspaces: dict[tuple[Any, ...], Workspace] = {}
        self.scalars: dict[tuple[Any, ...], torch.Tensor] = {}

    def __call__(
        self,
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
        if num_local + 1 > BUCKETS:
            raise ValueError(f"at most {BUCKETS - 1} local experts, not {num_local}")
        cfg = self.config or config_for(tokens)
        key = (hidden_states.device, tokens, hidden, inter, num_local, cfg)
        ws = self.workspaces.get(key)
        if ws is None:
            ws = self.workspaces[key] = Workspace.allocate(cfg, tokens, hidden, inter, num_local,
                                                           hidden_states.device)
        pairs = tokens * TOP_K

        device = hidden_states.device
        route_and_align(cfg, ws, num_local, routing_logits, routing_bias,
                        device_scalar(local_expert_offset, torch.int32, device, self.scalars),
                        device_scalar(routed_scaling_factor, torch.float32, device, self.scalars))
        # GEMM 1 on the FP8 tokens; their scales are [H/128, T]: (token, group) at group * T + token.
        grouped_gemm(cfg, ws, hidden_states, hidden_states_scale, (1, tokens), gemm1_weights,
                     gemm1_weights_scale, ws.gemm1, rows_per_a=TOP_K, mul_weight=False)
        silu_and_mul_kernel[(pairs, triton.cdiv(inter, SILU_COLUMNS))](
            ws.gemm1, ws.act, INTER=inter, COLUMNS=SILU_COLUMNS, num_warps=4,
        )
        group_quant_kernel[(pairs,)](ws.act, ws.act_q, ws.act_scale, INTER=inter, GROUP=BLOCK, num_warps=4)
        grouped_gemm(cfg, ws, ws.act_q, ws.act_scale, (ws.act_scale.stride(0), 1), gemm2_weights,
                     gemm2_weights_scale, ws.gemm2, rows_per_a=1, mul_weight=True)
        moe_sum_kernel[(tokens, triton.cdiv(hidden, SUM_COLUMNS))](
            ws.gemm2, output, HIDDEN=hidden, K=TOP_K, COLUMNS=SUM_COLUMNS, num_warps=4,
        )


def build(params: dict, kernels: object = None) -> Callable[..., None]:
    """The judge's entry point: a destination-passing callable. There are no knobs."""
    del kernels
    if params:
        raise ValueError(f"the baseline has no knobs, got {sorted(params)}")
    return Pipeline()


# -- ahead-of-time compilation (no GPU needed) -----------------------------------------------


def compile_kernels(cfg: GemmConfig, target: Any, hidden: int = 7168, inter: int = 2048,
                    num_local: int = 32) -> dict[str, Any]:
    """Compile every kernel a call with configuration ``cfg`` launches, for ``target`` (a
    GPUTarget): kernel name -> compiled kernel (its ``asm`` and ``metadata``)."""
    from triton.compiler import ASTSource

    def gemm(a: str, c: str, n: int, k: int, rows_per_a: int, mul_weight: bool) -> tuple[Any, ...]:
        pointers = {"a_ptr": a, "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32",
                    "c_ptr": c, "weight_ptr": "*fp32", "sorted_ptr": "*i32", "expert_ids_ptr": "*i32",
                    "post_pad_ptr": "*i32"}
        scalars = ("num_pairs", "padded_rows", "stride_am", "stride_asm", "stride_ask", "stride_be",
                   "stride_bn", "stride_bse", "stride_bsn", "stride_cm")
        constants = {"N": n, "K": k, "ROWS_PER_A": rows_per_a, "MUL_WEIGHT": mul_weight,
                     "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                     "GROUP_M": cfg.group_m, "STAGES": cfg.num_stages}
        return moe_gemm_kernel, {**pointers, **dict.fromkeys(scalars, "i32")}, constants, cfg.num_warps

    # What the launcher's specialisation sees at full width: 16-byte aligned tensors and
    # these integers divisible by 16 (the activation scales' strides are not).
    aligned = {"padded_rows", "stride_am", "stride_be", "stride_bn", "stride_cm"}

    jobs: dict[str, tuple[Any, dict[str, str], dict[str, Any], int]] = {
        "route_kernel": (
            route_kernel,
            {"logits_ptr": "*fp32", "bias_ptr": "*bf16", "factor_ptr": "*fp32", "offset_ptr": "*i32",
             "bucket_ptr": "*i32", "weight_ptr": "*fp32", "num_tokens": "i32"},
            {"NUM_EXPERTS": 256, "NUM_LOCAL": num_local, "GROUPS": NUM_GROUPS, "KEEP_GROUPS": TOPK_GROUPS,
             "K": TOP_K, "TOKENS": ROUTE_TOKENS},
            4,
        ),
        "align_kernel": (
            align_kernel,
            {"bucket_ptr": "*i32", "sorted_ptr": "*i32", "expert_ids_ptr": "*i32", "post_pad_ptr": "*i32",
             "cursor_ptr": "*i32", "num_pairs": "i32", "max_blocks": "i32"},
            {"NUM_LOCAL": num_local, "BUCKETS": BUCKETS, "BLOCK_M": cfg.block_m, "COUNT_CHUNK": COUNT_CHUNK,
             "LABEL_CHUNK": LABEL_CHUNK},
            8,
        ),
        "sort_kernel": (
            sort_kernel,
            {"bucket_ptr": "*i32", "cursor_ptr": "*i32", "sorted_ptr": "*i32", "num_pairs": "i32"},
            {"CHUNK": SORT_CHUNK},
            4,
        ),
        "gemm1": gemm("*fp8e4nv", "*bf16", 2 * inter, hidden, TOP_K, False),
        "silu_and_mul_kernel": (silu_and_mul_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16"},
                                {"INTER": inter, "COLUMNS": SILU_COLUMNS}, 4),
        "group_quant_kernel": (group_quant_kernel, {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32"},
                               {"INTER": inter, "GROUP": BLOCK}, 4),
        "gemm2": gemm("*fp8e4nv", "*bf16", hidden, inter, 1, True),
        "moe_sum_kernel": (moe_sum_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16"},
                           {"HIDDEN": hidden, "K": TOP_K, "COLUMNS": SUM_COLUMNS}, 4),
    }
    compiled = {}
    for name, (fn, signature, constants, warps) in jobs.items():
        attrs = {(fn.arg_names.index(arg),): [["tt.divisibility", 16]]
                 for arg, kind in signature.items() if kind.startswith("*") or arg in aligned}
        source = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constants, "constexpr")},
                           constexprs=constants, attrs=attrs)
        compiled[name] = triton.compile(source, target=target, options={"num_warps": warps})
    return compiled
