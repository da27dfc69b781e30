"""FP8 block-scale DeepSeek MoE rank in Triton, in the style of the fused-MoE kernels
of the SGLang and vLLM serving engines.

Stages (every shape static, no host sync: the whole call can be captured in a graph):

1. Routing (``ROUTING=triton``: one program per token; ``torch``: tensor ops). Sigmoid
   scores, the biased scores' group top-2 sums, the 4 best groups, the 8 best experts
   in them, weights from the unbiased scores, normalised, times the scaling factor.
2. Alignment (tensor ops). The (token, slot) pairs that chose a local expert are
   sorted by expert; each expert's run is padded to a multiple of ``BLOCK_M`` rows, so
   that every row block of the grouped GEMMs belongs to one expert. Pairs of other
   ranks are dropped. The grid is sized for the worst case (every pair local) and
   blocks past the last expert exit at once.
3. GEMM1 (grouped, FP8 x FP8 on the tensor cores, fp32 accumulation): for a block of
   rows and ``BLOCK_N1`` intermediate columns, both the up and the gate columns; each
   128-deep K step's product is scaled by the activation's and the weight's block
   scales before it is accumulated. ``SPLIT_K1`` splits the 56 K blocks among programs.
4. SwiGLU ``silu(gate) * up`` and quantisation of the result for GEMM2
   (``INTERMEDIATE=fp8``: per row and ``BLOCK_N1`` columns, scale amax/448;
   ``bf16``: no quantisation). With ``FUSE_SWIGLU`` and no split-K this is GEMM1's
   epilogue; otherwise GEMM1 writes (or atomically adds) fp32 and a small kernel does it.
5. GEMM2 (grouped) over the intermediate, ``SPLIT_K2`` ways, times each pair's
   routing weight.
6. Combine. ``COMBINE=atomic``: GEMM2 adds into an fp32 [T, 7168] buffer, then a cast.
   ``gather``: GEMM2 writes one row per pair and a kernel sums each token's rows in
   slot order (deterministic).

Tile sizes, split-K factors, fusion, the intermediate's format, the combine method and
pipeline stages are knobs (triton_fused.yaml); warps are launch parameters.
``compile_kernels`` compiles every kernel of a configuration ahead of time for any
target (the tests build them for sm_90 on a machine without a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 128
TOP_K = 8
NUM_GROUPS = 8
TOPK_GROUPS = 4
FP8_MAX = 448.0


# -- 1. routing ----------------------------------------------------------------------------


@triton.jit
def route_kernel(
    logits_ptr, bias_ptr, factor_ptr, ids_ptr, weights_ptr,
    NUM_EXPERTS: tl.constexpr, GROUPS: tl.constexpr, KEEP_GROUPS: tl.constexpr, K: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    GROUP_SIZE: tl.constexpr = NUM_EXPERTS // GROUPS
    expert = tl.arange(0, NUM_EXPERTS)
    logit = tl.load(logits_ptr + token * NUM_EXPERTS + expert)
    score = 1.0 / (1.0 + tl.exp(-logit))
    biased = score + tl.load(bias_ptr + expert).to(tl.float32)

    grouped = tl.reshape(biased, (GROUPS, GROUP_SIZE))
    column = tl.arange(0, GROUP_SIZE)
    first = tl.argmax(grouped, axis=1)
    best = tl.max(grouped, axis=1)
    second = tl.max(tl.where(column[None, :] == first[:, None], float("-inf"), grouped), axis=1)
    group_score = best + second

    group = tl.arange(0, GROUPS)
    keep = group < 0
    for _ in tl.static_range(KEEP_GROUPS):
        pick = tl.argmax(tl.where(keep, float("-inf"), group_score), axis=0)
        keep = keep | (group == pick)
    kept = tl.reshape(tl.broadcast_to(keep[:, None], (GROUPS, GROUP_SIZE)), (NUM_EXPERTS,))
    candidate = tl.where(kept, biased, float("-inf"))

    slot = tl.arange(0, K)
    ids = tl.zeros([K], dtype=tl.int32)
    chosen = tl.zeros([K], dtype=tl.float32)
    for j in tl.static_range(K):
        pick = tl.argmax(candidate, axis=0)
        ids = tl.where(slot == j, pick, ids)
        chosen = tl.where(slot == j, tl.sum(tl.where(expert == pick, score, 0.0), axis=0), chosen)
        candidate = tl.where(expert == pick, float("-inf"), candidate)
    weight = chosen / tl.sum(chosen, axis=0) * tl.load(factor_ptr)
    tl.store(ids_ptr + token * K + slot, ids)
    tl.store(weights_ptr + token * K + slot, weight)


def route_torch(
    logits: torch.Tensor, bias: torch.Tensor, factor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, experts = logits.shape
    score = torch.sigmoid(logits.float())
    biased = (score + bias.float()).view(tokens, NUM_GROUPS, experts // NUM_GROUPS)
    group_score = biased.topk(2, dim=2).values.sum(dim=2)
    kept = group_score.topk(TOPK_GROUPS, dim=1).indices
    keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
    biased = biased.masked_fill(~keep[:, :, None], float("-inf")).view(tokens, experts)
    ids = biased.topk(TOP_K, dim=1).indices
    chosen = score.gather(1, ids)
    return ids.to(torch.int32), chosen / chosen.sum(dim=1, keepdim=True) * factor.float()


# -- 2. alignment --------------------------------------------------------------------------


def align(
    ids: torch.Tensor, offset: torch.Tensor, num_local: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort local pairs by expert, each expert's run padded to ``block_m`` rows.

    Returns (pair id of every padded row, T*8 where padding; expert of every row
    block, ``num_local`` past the last one; row of every pair, -1 if not local).
    Only tensor ops of static shapes: nothing waits on the device.
    """
    pairs = ids.numel()
    device = ids.device
    local = ids.reshape(-1).long() - offset.long()
    is_local = (local >= 0) & (local < num_local)
    key = torch.where(is_local, local, num_local)
    counts = torch.zeros(num_local + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    blocks = (counts + block_m - 1) // block_m
    blocks[num_local] = 0
    block_end = torch.cumsum(blocks, 0)
    row_start = (block_end - blocks) * block_m
    first = torch.cumsum(counts, 0) - counts

    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    rank = torch.arange(pairs, device=device) - first[sorted_key]
    row = row_start[sorted_key] + rank
    valid = sorted_key < num_local

    max_blocks = triton.cdiv(pairs + min(num_local, pairs) * (block_m - 1), block_m)
    dump = max_blocks * block_m
    pair_of_row = torch.full((dump + 1,), pairs, dtype=torch.int32, device=device)
    pair_of_row.scatter_(0, torch.where(valid, row, dump), order.to(torch.int32))
    block_expert = torch.searchsorted(
        block_end[:num_local].contiguous(), torch.arange(max_blocks, device=device), right=True
    ).to(torch.int32)
    row_of_pair = torch.empty(pairs, dtype=torch.int32, device=device)
    row_of_pair.scatter_(0, order, torch.where(valid, row, -1).to(torch.int32))
    return pair_of_row[:dump], block_expert, row_of_pair


# -- 3./4. GEMM1 and SwiGLU ------------------------------------------------------------------


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
def gemm1_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, pair_of_row_ptr, block_expert_ptr,
    out_ptr, h_ptr, h_scale_ptr, num_tokens,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    SWIGLU_EPILOGUE: tl.constexpr, OUT_FP8: tl.constexpr, STAGES: tl.constexpr,
):
    """Rows of one expert x BLOCK_N up columns and the matching gate columns."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
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
    s_expert = w_scale_ptr + expert.to(tl.int64) * (2 * INTER // BK) * K_BLOCKS
    up_rows = cols.to(tl.int64)
    gate_rows = up_rows + INTER
    up_scale_rows = (cols // BK) * K_BLOCKS
    gate_scale_rows = ((cols + INTER) // BK) * K_BLOCKS

    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    kb_start = pid_k * PER_SPLIT
    kb_end = tl.minimum(kb_start + PER_SPLIT, K_BLOCKS)
    for kb in tl.range(kb_start, kb_end, num_stages=STAGES):
        offs = kb * BK + k
        a = tl.load(a_ptr + token[:, None] * HIDDEN + offs[None, :], mask=row_ok[:, None], other=0.0)
        a_scale = tl.load(a_scale_ptr + kb * num_tokens + token, mask=row_ok, other=0.0)
        w_up = tl.load(w_expert + up_rows[None, :] * HIDDEN + offs[:, None])
        w_gate = tl.load(w_expert + gate_rows[None, :] * HIDDEN + offs[:, None])
        s_up = tl.load(s_expert + up_scale_rows + kb)
        s_gate = tl.load(s_expert + gate_scale_rows + kb)
        acc_up += tl.dot(a, w_up) * (a_scale[:, None] * s_up[None, :])
        acc_gate += tl.dot(a, w_gate) * (a_scale[:, None] * s_gate[None, :])

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


@triton.jit
def swiglu_kernel(
    g1_ptr, pair_of_row_ptr, h_ptr, h_scale_ptr, num_tokens,
    INTER: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    OUT_FP8: tl.constexpr,
):
    """SwiGLU (and quantisation) of GEMM1's fp32 output, when not fused into GEMM1."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    col_block = tl.program_id(1)
    pair = tl.load(pair_of_row_ptr + rows)
    row_ok = pair < num_tokens * K
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    base = g1_ptr + rows.to(tl.int64)[:, None] * (2 * INTER) + cols[None, :]
    up = tl.load(base, mask=row_ok[:, None], other=0.0)
    gate = tl.load(base + INTER, mask=row_ok[:, None], other=0.0)
    _swiglu_store(up, gate, rows, row_ok, col_block, h_ptr, h_scale_ptr, INTER, BLOCK_N, OUT_FP8)


# -- 5. GEMM2 ------------------------------------------------------------------------------


@triton.jit
def gemm2_kernel(
    h_ptr, h_scale_ptr, w_ptr, w_scale_ptr, pair_of_row_ptr, block_expert_ptr, weights_ptr,
    out_ptr, num_tokens,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    IN_FP8: tl.constexpr, ATOMIC_TOKENS: tl.constexpr, STAGES: tl.constexpr,
):
    """Rows of one expert x BLOCK_N hidden columns, times each pair's routing weight.

    ATOMIC_TOKENS: add into out[token] (fp32 [T, HIDDEN]); else write out[row]
    ([rows, HIDDEN], added atomically when split along K).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= NUM_LOCAL:
        return
    K_STEPS: tl.constexpr = INTER // BLOCK_K
    PER_SPLIT: tl.constexpr = (K_STEPS + SPLIT_K - 1) // SPLIT_K
    W_K_BLOCKS: tl.constexpr = INTER // 128
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows64 = rows.to(tl.int64)
    pair = tl.load(pair_of_row_ptr + rows)
    row_ok = pair < num_tokens * K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    w_expert = w_ptr + expert.to(tl.int64) * (HIDDEN * INTER)
    s_rows = w_scale_ptr + expert.to(tl.int64) * (HIDDEN // 128) * W_K_BLOCKS + (cols // 128) * W_K_BLOCKS

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    step_start = pid_k * PER_SPLIT
    step_end = tl.minimum(step_start + PER_SPLIT, K_STEPS)
    for step in tl.range(step_start, step_end, num_stages=STAGES):
        offs = step * BLOCK_K + k
        a = tl.load(h_ptr + rows64[:, None] * INTER + offs[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_expert + cols.to(tl.int64)[None, :] * INTER + offs[:, None])
        w_scale = tl.load(s_rows + (step * BLOCK_K) // 128)
        if IN_FP8:
            a_scale = tl.load(h_scale_ptr + rows64 * K_STEPS + step, mask=row_ok, other=0.0)
            acc += tl.dot(a, w) * (a_scale[:, None] * w_scale[None, :])
        else:
            acc += tl.dot(a, w.to(tl.bfloat16)) * w_scale[None, :]

    weight = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * weight[:, None]
    if ATOMIC_TOKENS:
        token = tl.where(row_ok, pair // K, 0).to(tl.int64)
        tl.atomic_add(out_ptr + token[:, None] * HIDDEN + cols[None, :], acc, mask=row_ok[:, None], sem="relaxed")
    elif SPLIT_K == 1:
        tl.store(out_ptr + rows64[:, None] * HIDDEN + cols[None, :], acc, mask=row_ok[:, None])
    else:
        tl.atomic_add(out_ptr + rows64[:, None] * HIDDEN + cols[None, :], acc, mask=row_ok[:, None], sem="relaxed")


# -- 6. combine ----------------------------------------------------------------------------


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


class Config:
    """The knob and launch values of one candidate, checked once at build time."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.routing = str(params.get("ROUTING", "triton"))
        self.block_m = int(params.get("BLOCK_M", 64))
        self.block_n1 = int(params.get("BLOCK_N1", 128))
        self.split_k1 = int(params.get("SPLIT_K1", 1))
        self.fuse_swiglu = bool(params.get("FUSE_SWIGLU", True))
        self.intermediate_fp8 = str(params.get("INTERMEDIATE", "fp8")) == "fp8"
        self.block_n2 = int(params.get("BLOCK_N2", 128))
        self.split_k2 = int(params.get("SPLIT_K2", 1))
        self.combine = str(params.get("COMBINE", "atomic"))
        self.stages = int(params.get("STAGES", 3))
        self.warps1 = int(params.get("NUM_WARPS1", 8))
        self.warps2 = int(params.get("NUM_WARPS2", 4))
        if self.routing not in ("triton", "torch"):
            raise ValueError(f"ROUTING must be triton or torch, not {self.routing!r}")
        if self.combine not in ("atomic", "gather"):
            raise ValueError(f"COMBINE must be atomic or gather, not {self.combine!r}")
        for name, value in (("block_m", self.block_m), ("block_n1", self.block_n1),
                            ("block_n2", self.block_n2)):
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name.upper()} must be a power of two >= 16, not {value}")
        if BLOCK % self.block_n1 and self.block_n1 % BLOCK:
            raise ValueError("BLOCK_N1 must divide or be a multiple of 128")

    @property
    def epilogue(self) -> bool:
        """SwiGLU in GEMM1's epilogue: needs the whole K sum in one program."""
        return self.fuse_swiglu and self.split_k1 == 1

    @property
    def block_k2(self) -> int:
        """GEMM2's K step: one quantisation group of the intermediate (at most 128)."""
        return min(self.block_n1, BLOCK) if self.intermediate_fp8 else BLOCK


def build(params: dict, kernels: object = None) -> Callable[..., None]:
    del kernels
    cfg = Config(params)
    if cfg.intermediate_fp8 and cfg.block_n1 > BLOCK:
        raise ValueError("INTERMEDIATE=fp8 quantises per BLOCK_N1 columns: BLOCK_N1 must be <= 128")

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
        device = hidden_states.device

        if cfg.routing == "triton":
            ids = torch.empty(tokens, TOP_K, dtype=torch.int32, device=device)
            weights = torch.empty(tokens, TOP_K, dtype=torch.float32, device=device)
            route_kernel[(tokens,)](
                routing_logits, routing_bias, routed_scaling_factor, ids, weights,
                NUM_EXPERTS=routing_logits.shape[1], GROUPS=NUM_GROUPS, KEEP_GROUPS=TOPK_GROUPS, K=TOP_K,
            )
        else:
            ids, weights = route_torch(routing_logits, routing_bias, routed_scaling_factor)
        pair_of_row, block_expert, row_of_pair = align(ids, local_expert_offset, num_local, cfg.block_m)
        max_blocks = block_expert.numel()
        rows = pair_of_row.numel()

        h_dtype = torch.float8_e4m3fn if cfg.intermediate_fp8 else torch.bfloat16
        h = torch.empty(rows, inter, dtype=h_dtype, device=device)
        h_scale = torch.empty(rows, inter // cfg.block_n1 if cfg.intermediate_fp8 else 1, device=device)
        if cfg.epilogue:
            g1 = h_scale  # unused
        elif cfg.split_k1 == 1:
            g1 = torch.empty(rows, 2 * inter, device=device)
        else:
            g1 = torch.zeros(rows, 2 * inter, device=device)
        gemm1_kernel[(max_blocks, inter // cfg.block_n1, cfg.split_k1)](
            hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
            pair_of_row, block_expert, g1, h, h_scale, tokens,
            HIDDEN=hidden, INTER=inter, K=TOP_K, NUM_LOCAL=num_local,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n1, SPLIT_K=cfg.split_k1,
            SWIGLU_EPILOGUE=cfg.epilogue, OUT_FP8=cfg.intermediate_fp8, STAGES=cfg.stages,
            num_warps=cfg.warps1,
        )
        if not cfg.epilogue:
            swiglu_kernel[(max_blocks, inter // cfg.block_n1)](
                g1, pair_of_row, h, h_scale, tokens,
                INTER=inter, K=TOP_K, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n1,
                OUT_FP8=cfg.intermediate_fp8, num_warps=4,
            )

        atomic = cfg.combine == "atomic"
        if atomic:
            target = torch.zeros(tokens, hidden, device=device)
        elif cfg.split_k2 == 1:
            target = torch.empty(rows, hidden, device=device)
        else:
            target = torch.zeros(rows, hidden, device=device)
        gemm2_kernel[(max_blocks, triton.cdiv(hidden, cfg.block_n2), cfg.split_k2)](
            h, h_scale, gemm2_weights, gemm2_weights_scale, pair_of_row, block_expert, weights,
            target, tokens,
            HIDDEN=hidden, INTER=inter, K=TOP_K, NUM_LOCAL=num_local,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n2, BLOCK_K=cfg.block_k2, SPLIT_K=cfg.split_k2,
            IN_FP8=cfg.intermediate_fp8, ATOMIC_TOKENS=atomic, STAGES=cfg.stages,
            num_warps=cfg.warps2,
        )
        if atomic:
            output.copy_(target)
        else:
            combine_kernel[(tokens, triton.cdiv(hidden, 512))](
                target, row_of_pair, output, HIDDEN=hidden, K=TOP_K, BLOCK_N=512,
            )

    return run


# -- ahead-of-time compilation (no GPU needed) ---------------------------------------------


def compile_kernels(params: dict, target: Any, hidden: int = 7168, inter: int = 2048) -> dict[str, Any]:
    """Compile every kernel one configuration launches, for ``target`` (a GPUTarget).

    Returns kernel name -> compiled kernel (its ``asm`` and ``metadata``). Raises what
    the compiler raises for a configuration that does not fit the target.
    """
    from triton.compiler import ASTSource

    cfg = Config(params)
    h_type = "*fp8e4nv" if cfg.intermediate_fp8 else "*bf16"
    jobs: dict[str, tuple[Any, dict[str, str], dict[str, Any], int]] = {
        "gemm1_kernel": (
            gemm1_kernel,
            {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
             "pair_of_row_ptr": "*i32", "block_expert_ptr": "*i32", "out_ptr": "*fp32", "h_ptr": h_type,
             "h_scale_ptr": "*fp32", "num_tokens": "i32"},
            {"HIDDEN": hidden, "INTER": inter, "K": TOP_K, "NUM_LOCAL": 32, "BLOCK_M": cfg.block_m,
             "BLOCK_N": cfg.block_n1, "SPLIT_K": cfg.split_k1, "SWIGLU_EPILOGUE": cfg.epilogue,
             "OUT_FP8": cfg.intermediate_fp8, "STAGES": cfg.stages},
            cfg.warps1,
        ),
        "gemm2_kernel": (
            gemm2_kernel,
            {"h_ptr": h_type, "h_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
             "pair_of_row_ptr": "*i32", "block_expert_ptr": "*i32", "weights_ptr": "*fp32",
             "out_ptr": "*fp32", "num_tokens": "i32"},
            {"HIDDEN": hidden, "INTER": inter, "K": TOP_K, "NUM_LOCAL": 32, "BLOCK_M": cfg.block_m,
             "BLOCK_N": cfg.block_n2, "BLOCK_K": cfg.block_k2, "SPLIT_K": cfg.split_k2,
             "IN_FP8": cfg.intermediate_fp8, "ATOMIC_TOKENS": cfg.combine == "atomic", "STAGES": cfg.stages},
            cfg.warps2,
        ),
    }
    if cfg.routing == "triton":
        jobs["route_kernel"] = (
            route_kernel,
            {"logits_ptr": "*fp32", "bias_ptr": "*bf16", "factor_ptr": "*fp32", "ids_ptr": "*i32",
             "weights_ptr": "*fp32"},
            {"NUM_EXPERTS": 256, "GROUPS": NUM_GROUPS, "KEEP_GROUPS": TOPK_GROUPS, "K": TOP_K},
            4,
        )
    if not cfg.epilogue:
        jobs["swiglu_kernel"] = (
            swiglu_kernel,
            {"g1_ptr": "*fp32", "pair_of_row_ptr": "*i32", "h_ptr": h_type, "h_scale_ptr": "*fp32",
             "num_tokens": "i32"},
            {"INTER": inter, "K": TOP_K, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n1,
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
        signature = {**signature, **{c: "constexpr" for c in constexprs}}
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        compiled[name] = triton.compile(source, target=target, options={"num_warps": warps})
    return compiled
