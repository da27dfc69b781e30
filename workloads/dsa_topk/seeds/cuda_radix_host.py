"""Host side of the cuda_radix candidate: launches score_pages and select_topk.

Only shapes steer the launches (no host synchronisation, CUDA-graph safe):

* ``max_pages * 64 <= topk``: no row can need scores, so only ``select_topk`` runs; it
  writes every valid token's global id and pads with -1.
* otherwise ``score_pages`` fills a [B, max_pages*64] float32 score buffer (blocks of
  rows with L <= topk, or past L, exit at once), then ``select_topk`` radix-selects.

PAGES_PER_BLOCK (knob) is passed to the kernel at run time; 0 picks it from the shape so
that the score grid still fills the GPU for small batches.
"""

from __future__ import annotations

import torch

PAGE_TOKENS = 64
_DEFAULT_SMS = 132


def _sm_count(device: torch.device, cache: dict) -> int:
    if device.type != "cuda":
        return _DEFAULT_SMS
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in cache:
        cache[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return cache[key]


def select_smem_bytes(slots: int, max_pages: int, radix_bits: int) -> int:
    """histogram u32[2^bits] + keys u32[slots] + candidates u16[slots] + block table."""
    return 4 * (1 << radix_bits) + 6 * slots + 4 * max_pages


def build(params: dict, kernels):
    if kernels is None:
        raise RuntimeError("cuda_radix needs compiled kernels (a CUDA device)")
    pages_per_block = int(params.get("PAGES_PER_BLOCK", 1))
    blocks_per_sm = int(params.get("BLOCKS_PER_SM_TARGET", 2))
    score_threads = int(params.get("SCORE_THREADS", 128))
    select_threads = int(params.get("SELECT_THREADS", 1024))
    radix_bits = int(params.get("RADIX_BITS", 11))
    score = kernels["score_pages"]
    select = kernels["select_topk"]
    sms: dict = {}

    def choose_ppb(batch: int, max_pages: int, device: torch.device) -> int:
        if pages_per_block > 0:
            return pages_per_block
        want = blocks_per_sm * _sm_count(device, sms)
        for ppb in (4, 2):
            if -(-max_pages // ppb) * batch >= want:
                return ppb
        return 1

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
        slots = max_pages * PAGE_TOKENS
        if batch == 0:
            return
        if slots <= topk:
            select(
                (batch, 1, 1),
                (select_threads, 1, 1),
                topk_indices,  # scores are never read on this path
                seq_lens,
                block_table,
                topk_indices,
                max_pages,
                topk,
                shared_mem=0,
            )
            return
        scores = torch.empty(batch, slots, device=block_table.device, dtype=torch.float32)
        ppb = choose_ppb(batch, max_pages, block_table.device)
        score(
            (-(-max_pages // ppb), batch, 1),
            (score_threads, 1, 1),
            q_index_fp8,
            k_index_cache_fp8,
            weights,
            seq_lens,
            block_table,
            scores,
            max_pages,
            topk,
            ppb,
        )
        select(
            (batch, 1, 1),
            (select_threads, 1, 1),
            scores,
            seq_lens,
            block_table,
            topk_indices,
            max_pages,
            topk,
            shared_mem=select_smem_bytes(slots, max_pages, radix_bits),
        )

    return run
