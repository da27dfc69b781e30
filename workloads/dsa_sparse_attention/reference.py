"""PyTorch reference for DSA sparse attention (evokernel's own implementation).

It computes the same function as the FlashInfer-Bench reference, in float32: for
each query token and head, logits = (q_nope . latent + q_pe . rotary key) * sm_scale
over the tokens its index row names (-1 slots ignored), lse = log2 of the sum of
their exponentials, output = softmax(logits) @ latents in bf16; a token with no valid
index gets a zero output and lse -inf.

Unlike the published reference, which converts the whole cache to float32 and walks
the batch in Python, it gathers only the indexed rows and handles every token in the
same batched matmuls, without a host synchronisation.
"""

from __future__ import annotations

import math

import torch

INV_LN2 = 1.0 / math.log(2.0)


@torch.no_grad()
def run(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    sm_scale: torch.Tensor | float,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, _heads, ckv_dim = q_nope.shape
    kpe_dim = q_pe.shape[-1]
    topk = sparse_indices.shape[-1]

    valid = sparse_indices != -1  # [T, K]
    rows = torch.where(valid, sparse_indices, 0).long().reshape(-1)
    latents = ckv_cache.reshape(-1, ckv_dim).index_select(0, rows).float()
    rotary = kpe_cache.reshape(-1, kpe_dim).index_select(0, rows).float()
    latents = latents.view(num_tokens, topk, ckv_dim)
    rotary = rotary.view(num_tokens, topk, kpe_dim)

    logits = torch.bmm(q_nope.float(), latents.transpose(1, 2))
    logits += torch.bmm(q_pe.float(), rotary.transpose(1, 2))  # [T, H, K]
    logits = logits * sm_scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))

    lse = torch.logsumexp(logits, dim=-1)  # [T, H]; -inf where a row has no valid index
    attended = valid.any(dim=-1)[:, None, None]
    weights = torch.where(attended, torch.exp(logits - lse[..., None]), 0.0)
    output = torch.bmm(weights, latents)
    return output.to(torch.bfloat16), lse * INV_LN2
