"""PyTorch reference for the FP8 block-scale DeepSeek MoE rank (evokernel's own).

The same function as the FlashInfer-Bench reference, in float32 throughout:

1. Routing (DeepSeek no-aux): scores ``s = sigmoid(logits)``; selection uses ``s + bias``;
   the 256 experts form 8 groups of 32; a group's score is the sum of its two best
   biased scores; the 4 best groups are kept; the 8 best experts of the kept groups are
   chosen. A chosen expert's weight is its unbiased ``s`` over the sum of the chosen
   ones' ``s``, times ``routed_scaling_factor``.
2. For every local expert (global id ``local_expert_offset + i``, i < 32) some token
   chose: dequantise the tokens' activations and the expert's weights (value x the scale
   of its 128-block), GEMM1, SwiGLU ``silu(gate) * up`` where ``up`` is the first half
   of GEMM1's output and ``gate`` the second, GEMM2, and add weight x result to the
   token's row. Tokens that chose no local expert get zeros. Cast to bfloat16.

Unlike the published reference, it dequantises only the experts some token chose and
never materialises expanded scale tensors, so on a CPU it needs hundreds of megabytes
where that one needs about 18 GB. Like it, it loops over experts in Python (one host
sync for the per-expert token counts). Sizes are read from the tensors, so the tests
can compare it with the published reference at a reduced width as well.
"""

from __future__ import annotations

import torch

BLOCK = 128
NUM_EXPERTS = 256
NUM_LOCAL = 32
TOP_K = 8
NUM_GROUPS = 8
TOPK_GROUPS = 4


def route(
    routing_logits: torch.Tensor, routing_bias: torch.Tensor, routed_scaling_factor: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek no-aux routing: ([T, 8] int64 global expert ids, [T, 8] float32 weights).

    The ids come in no particular order; weights[t, j] belongs to ids[t, j].
    """
    tokens = routing_logits.shape[0]
    scores = 1.0 / (1.0 + torch.exp(-routing_logits.float()))
    biased = scores + routing_bias.float().reshape(-1)
    grouped = biased.view(tokens, NUM_GROUPS, NUM_EXPERTS // NUM_GROUPS)
    group_scores = grouped.topk(2, dim=2, sorted=False).values.sum(dim=2)
    kept_groups = group_scores.topk(TOPK_GROUPS, dim=1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)
    pruned = grouped.masked_fill(~keep[:, :, None], torch.finfo(torch.float32).min)
    ids = pruned.view(tokens, NUM_EXPERTS).topk(TOP_K, dim=1, sorted=False).indices
    chosen = scores.gather(1, ids)
    weights = chosen / (chosen.sum(dim=1, keepdim=True) + 1e-20) * routed_scaling_factor
    return ids, weights


def dequantize_rows(
    values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """[R, C] fp8 values with [R/128, C/128] block scales -> float32 [R, C] (into ``out``)."""
    rows, cols = values.shape
    out = torch.empty(rows, cols, device=values.device) if out is None else out
    blocks = out.copy_(values).view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    blocks.mul_(scales.float()[:, None, :, None])
    return out


def dequantize_activations(hidden_states: torch.Tensor, hidden_states_scale: torch.Tensor) -> torch.Tensor:
    """[T, H] fp8 with [H/128, T] scales -> float32 [T, H]."""
    tokens, hidden = hidden_states.shape
    blocks = hidden_states.float().view(tokens, hidden // BLOCK, BLOCK)
    return (blocks * hidden_states_scale.float().t()[:, :, None]).view(tokens, hidden)


def expert_mlp(
    activations: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One expert on float32 [n, H] activations: GEMM1, SwiGLU, GEMM2 -> [n, H].

    ``scratch``: float32 buffers shaped like ``w13`` and ``w2`` to dequantise into
    (reused across experts: on a CPU, fresh 100 MB buffers cost more than the GEMMs).
    """
    w13_out, w2_out = scratch if scratch is not None else (None, None)
    gemm1 = activations @ dequantize_rows(w13, w13_scale, w13_out).t()
    intermediate = w2.shape[1]
    up, gate = gemm1[:, :intermediate], gemm1[:, intermediate:]
    hidden = gate / (1.0 + torch.exp(-gate)) * up
    return hidden @ dequantize_rows(w2, w2_scale, w2_out).t()


@torch.no_grad()
def run(
    routing_logits: torch.Tensor,
    routing_bias: torch.Tensor,
    hidden_states: torch.Tensor,
    hidden_states_scale: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm1_weights_scale: torch.Tensor,
    gemm2_weights: torch.Tensor,
    gemm2_weights_scale: torch.Tensor,
    local_expert_offset: torch.Tensor | int,
    routed_scaling_factor: torch.Tensor | float,
) -> tuple[torch.Tensor]:
    tokens = routing_logits.shape[0]
    ids, weights = route(routing_logits, routing_bias, routed_scaling_factor)
    local = ids - int(local_expert_offset)
    is_local = (local >= 0) & (local < gemm1_weights.shape[0])
    token_of = torch.arange(tokens, device=ids.device)[:, None].expand_as(ids)

    # Local (token, expert) pairs, grouped by expert, tokens ascending within each.
    experts, order = local[is_local].sort(stable=True)
    pair_tokens = token_of[is_local][order]
    pair_weights = weights[is_local][order]
    counts = torch.bincount(experts, minlength=gemm1_weights.shape[0]).tolist()

    activations = dequantize_activations(hidden_states, hidden_states_scale)
    out = torch.zeros(tokens, hidden_states.shape[1], dtype=torch.float32, device=hidden_states.device)
    scratch = (
        torch.empty(gemm1_weights.shape[1:], device=hidden_states.device),
        torch.empty(gemm2_weights.shape[1:], device=hidden_states.device),
    )
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = pair_tokens[start : start + count]
        result = expert_mlp(
            activations[rows],
            gemm1_weights[expert], gemm1_weights_scale[expert],
            gemm2_weights[expert], gemm2_weights_scale[expert], scratch,
        )
        out.index_add_(0, rows, result * pair_weights[start : start + count, None])
        start += count
    return (out.to(torch.bfloat16),)
