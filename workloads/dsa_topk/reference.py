"""PyTorch reference for the DSA TopK indexer (evokernel's own implementation).

It computes the same function as the FlashInfer-Bench reference: per query row, a
head-weighted sum of ReLU(q . k) over the row's valid tokens, then the top 2048 as
global token ids. Like the published one it walks the batch in Python with a host
sync per row, which is what makes it slow; unlike it, it dequantises only the pages
a row uses rather than the whole cache, so speedups measured against it are, if
anything, smaller than against the published reference.
"""

from __future__ import annotations

import torch

PAGE = 64
DIM = 128
TOPK = 2048
PAGE_BYTES = PAGE * (DIM + 4)


def dequantize_pages(cache: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """Keys of the given physical pages as float32, shape [len(pages) * 64, 128]."""
    flat = cache.view(torch.uint8).reshape(cache.shape[0], PAGE_BYTES)[pages.long()]
    values = flat[:, : PAGE * DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = flat[:, PAGE * DIM :].contiguous().view(torch.float32)
    return (values.view(-1, PAGE, DIM) * scales.view(-1, PAGE, 1)).reshape(-1, DIM)


@torch.no_grad()
def run(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> tuple[torch.Tensor]:
    batch = q_index_fp8.shape[0]
    out = torch.full((batch, TOPK), -1, dtype=torch.int32, device=q_index_fp8.device)
    queries = q_index_fp8.float()
    for row in range(batch):
        length = int(seq_lens[row].item())
        if length <= 0:
            continue
        pages = block_table[row, : (length + PAGE - 1) // PAGE]
        keys = dequantize_pages(k_index_cache_fp8, pages)[:length]
        per_head = torch.relu(queries[row] @ keys.T)
        scores = (per_head * weights[row][:, None]).sum(dim=0)
        k = min(TOPK, length)
        local = torch.topk(scores, k).indices
        token_ids = pages.long()[local // PAGE] * PAGE + local % PAGE
        out[row, :k] = token_ids.to(torch.int32)
    return (out,)
