"""DSA top-k indexer: Triton scoring kernel + torch.topk selection.

One program scores BLOCK_TOKENS consecutive logical tokens of one row: it gathers
their fp8 keys through the block table, multiplies the row's 64x128 fp8 query by
them on the tensor cores (tl.dot), applies relu, the weighted head sum and each
token's scale, and writes a [B, max_pages*64] float32 score buffer. Slots at or past
the row's length get -inf. Rows with L <= topk need no scores (every valid token is
chosen), so their valid slots get 0.0 without reading any key.

Page layout (8448 bytes per physical page): 64 tokens x 128 fp8 key bytes, token
major, then 64 float32 scales. Scales are positive, so relu(s*x) == s*relu(x).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PAGE_TOKENS = tl.constexpr(64)
PAGE_BYTES = tl.constexpr(8448)
PAGE_FLOATS = tl.constexpr(2112)  # PAGE_BYTES // 4
SCALE_FLOAT_OFFSET = tl.constexpr(2048)  # first scale, in floats from the page start


@triton.jit
def dsa_score_kernel(
    q_ptr,  # uint8 [B, 64, 128] (fp8 e4m3 bytes)
    k_ptr,  # uint8 [num_pages * 8448]
    kf_ptr,  # float32 view of the same cache [num_pages * 2112]
    w_ptr,  # float32 [B, 64]
    len_ptr,  # int32 [B]
    bt_ptr,  # int32 [B, max_pages]
    score_ptr,  # float32 [B, slots]
    max_pages,
    slots,
    topk,
    BLOCK_TOKENS: tl.constexpr,
    DOT_FP8: tl.constexpr,
):
    blk = tl.program_id(0)
    row = tl.program_id(1)
    length = tl.load(len_ptr + row)
    need_scores = length > topk

    tok = blk * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)
    in_row = tok < length
    live = in_row & need_scores
    page = tl.load(bt_ptr + row * max_pages + tok // PAGE_TOKENS, mask=live, other=0)
    page = page.to(tl.int64)
    offset = tok % PAGE_TOKENS

    dim = tl.arange(0, 128)
    head = tl.arange(0, 64)
    key_addr = page[:, None] * PAGE_BYTES + offset[:, None] * 128 + dim[None, :]
    key_bytes = tl.load(k_ptr + key_addr, mask=live[:, None], other=0)
    q_bytes = tl.load(q_ptr + row * 8192 + head[:, None] * 128 + dim[None, :])
    keys = key_bytes.to(tl.float8e4nv, bitcast=True)
    q = q_bytes.to(tl.float8e4nv, bitcast=True)
    if DOT_FP8:
        logits = tl.dot(q, tl.trans(keys))  # [64, BLOCK_TOKENS] fp32
    else:
        logits = tl.dot(q.to(tl.float16), tl.trans(keys.to(tl.float16)))

    w = tl.load(w_ptr + row * 64 + head)
    raw = tl.sum(tl.maximum(logits, 0.0) * w[:, None], axis=0)  # [BLOCK_TOKENS]
    scale = tl.load(kf_ptr + page * PAGE_FLOATS + SCALE_FLOAT_OFFSET + offset, mask=live, other=0.0)
    score = tl.where(need_scores, raw * scale, 0.0)
    score = tl.where(in_row, score, float("-inf"))
    tl.store(score_ptr + row * slots + tok, score, mask=tok < slots)


def _global_ids(block_table: torch.Tensor) -> torch.Tensor:
    batch, pages = block_table.shape
    offsets = torch.arange(64, device=block_table.device, dtype=torch.int64)
    ids = block_table.to(torch.int64)[:, :, None] * 64 + offsets
    return ids.reshape(batch, pages * 64)


def build(params: dict, kernels: object = None):
    del kernels
    block_tokens = int(params.get("BLOCK_TOKENS", 64))
    dot_fp8 = bool(params.get("DOT_FP8", False))
    num_warps = int(params.get("num_warps", 4))

    def run(
        q_index_fp8: torch.Tensor,
        k_index_cache_fp8: torch.Tensor,
        weights: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        topk_indices: torch.Tensor,
    ) -> None:
        batch, max_pages = block_table.shape
        topk = topk_indices.shape[1]
        slots = max_pages * 64
        device = block_table.device
        ids = _global_ids(block_table)

        if slots <= topk:
            position = torch.arange(slots, device=device, dtype=torch.int64)
            valid = position[None, :] < seq_lens.to(torch.int64)[:, None]
            topk_indices[:, :slots].copy_(torch.where(valid, ids, torch.full_like(ids, -1)))
            topk_indices[:, slots:].fill_(-1)
            return

        cache_u8 = k_index_cache_fp8.view(torch.uint8).reshape(-1)
        cache_f32 = cache_u8.view(torch.float32)
        scores = torch.empty(batch, slots, device=device, dtype=torch.float32)
        grid = (triton.cdiv(slots, block_tokens), batch)
        dsa_score_kernel[grid](
            q_index_fp8.view(torch.uint8),
            cache_u8,
            cache_f32,
            weights,
            seq_lens,
            block_table,
            scores,
            max_pages,
            slots,
            topk,
            BLOCK_TOKENS=block_tokens,
            DOT_FP8=dot_fp8,
            num_warps=num_warps,
        )
        values, local = torch.topk(scores, topk, dim=1)
        chosen = ids.gather(1, local)
        chosen = torch.where(torch.isneginf(values), torch.full_like(chosen, -1), chosen)
        topk_indices.copy_(chosen)

    return run
