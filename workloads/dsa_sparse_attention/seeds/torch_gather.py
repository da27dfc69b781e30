"""DSA sparse attention in plain PyTorch, vectorised over the whole batch.

Gathers the indexed latent and rotary rows of every query token at once, computes
all logits with batched matmuls, and writes the softmax-weighted latents and the
base-2 log-sum-exp into the given outputs. Shapes alone decide the work (-1 slots
gather row 0 and are masked), so it never waits on the device and can be captured
in a CUDA graph. Works on CPU and CUDA tensors.

Knobs (see torch_gather.yaml):

* ``LOGIT_DTYPE``: the dtype of the q.k matmuls. bfloat16 keeps the gathered rows
  in their stored dtype (no float32 copy) but returns bf16 logits (8 significant
  bits); the correctness gate decides whether that is close enough.
* ``QK``: ``split`` runs one matmul for the latent part and one for the rotary
  part; ``concat`` gathers [latent | rotary] rows and runs one 576-wide matmul.
* ``SOFTMAX``: ``torch`` uses logsumexp then exp; ``exp2`` works in base 2
  throughout (scale folded with log2(e)), as the GPU kernels do.
"""

from __future__ import annotations

import math

import torch

LOG2E = 1.0 / math.log(2.0)


def build(params: dict, kernels: object = None):
    del kernels
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    logit_dtype = dtypes[str(params.get("LOGIT_DTYPE", "float32"))]
    qk = str(params.get("QK", "split"))
    softmax = str(params.get("SOFTMAX", "torch"))

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
        tokens, _heads, ckv_dim = q_nope.shape
        kpe_dim = q_pe.shape[-1]
        topk = sparse_indices.shape[1]
        valid = sparse_indices >= 0
        rows = torch.where(valid, sparse_indices, 0).reshape(-1).long()

        latents = ckv_cache.reshape(-1, ckv_dim).index_select(0, rows)
        latents = latents.view(tokens, topk, ckv_dim)
        rotary = kpe_cache.reshape(-1, kpe_dim).index_select(0, rows).view(tokens, topk, kpe_dim)
        if qk == "concat":
            keys = torch.cat([latents, rotary], dim=-1).to(logit_dtype)
            queries = torch.cat([q_nope, q_pe], dim=-1).to(logit_dtype)
            logits = torch.bmm(queries, keys.transpose(1, 2)).float()
        else:
            logits = torch.bmm(q_nope.to(logit_dtype), latents.to(logit_dtype).transpose(1, 2))
            logits = logits.float()
            logits += torch.bmm(q_pe.to(logit_dtype), rotary.to(logit_dtype).transpose(1, 2))

        mask = ~valid[:, None, :]
        if softmax == "exp2":
            scaled = (logits * (sm_scale * LOG2E)).masked_fill_(mask, float("-inf"))
            peak = scaled.amax(dim=-1, keepdim=True)
            peak = torch.where(torch.isfinite(peak), peak, 0.0)
            weights = torch.exp2(scaled - peak)
            total = weights.sum(dim=-1, keepdim=True)
            lse.copy_((peak + torch.log2(total)).squeeze(-1))
            weights = weights / total.clamp_min(torch.finfo(torch.float32).tiny)
        else:
            scaled = (logits * sm_scale).masked_fill_(mask, float("-inf"))
            natural = torch.logsumexp(scaled, dim=-1, keepdim=True)
            lse.copy_((natural * LOG2E).squeeze(-1))
            weights = torch.exp(scaled - natural).nan_to_num_(nan=0.0)
        output.copy_(torch.bmm(weights, latents.float()))

    if str(params.get("COMPILE", "eager")) == "inductor":
        # torch.compile of this same function, the column a PyTorch user gets for free;
        # its first call per shape compiles, inside the evaluation's time limit
        return torch.compile(run, dynamic=False)
    return run
