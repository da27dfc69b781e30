"""A CPU model of Hopper's fp8 tensor-core accumulation, applied to dsa_topk scores (CPU).

    python benchmarks/fp8_accumulation_model.py [--shape 70d53807-...] [--seeds 10]

Hopper's fp8 MMA (wgmma and mma.sync alike) sums 32 products in fixed point aligned
to the largest exponent among them and the accumulator it adds them to, keeping about
14 bits (DeepSeek-V3 report, section 3.5.2; SageAttention2: the accumulator is
effectively fp22, 13 mantissa bits, truncated). The model: per 32-wide K slice,
each term (the products and the accumulator) is floored (sign-fill right shift) to
2^-13 of the leading bit of the largest |term|, and the sum truncated to 13 mantissa
bits. Three ways of scoring a token are compared, each as a kernel's path groups K:

* ``chained``: wgmma's four K slices of 32 contiguous bytes chained in the accumulator
  (cuda_family's wgmma path before it summed the slices in fp32);
* ``mma_sync``: the fp8 path's four k32 steps (byte 32t+8s+b of lane t at step s), chained;
* ``sliced``: every slice from a zero accumulator, the slices summed in fp32.

For each scored row it prints how far below the reference's the chosen tokens' sorted
scores fall at worst (the checker fails a rank off by more than 0.01 and more than 1%,
so a row whose top-k boundary lies near zero fails at a shortfall above 0.01). A model,
not a measurement: no GPU is used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from evokernel.workload import load_workload

PAGE, DIM, TOPK = 64, 128, 2048
MMA_SYNC_ORDER = [32 * t + 8 * s + b for s in range(4) for t in range(4) for b in range(8)]


def _floor_to(x: torch.Tensor, quantum: torch.Tensor) -> torch.Tensor:
    return torch.floor(x / quantum) * quantum


def slice_sum(products: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """acc + the sum of products [..., 32], as the model says the tensor core adds them."""
    top = torch.maximum(products.abs().amax(-1), acc.abs())
    _, exp = torch.frexp(top)
    quantum = torch.where(top > 0, torch.ldexp(torch.ones_like(top), exp - 14), torch.ones_like(top))
    total = _floor_to(products, quantum.unsqueeze(-1)).sum(-1) + _floor_to(acc, quantum)
    _, exp2 = torch.frexp(total)
    q2 = torch.ldexp(torch.ones_like(total), exp2 - 14)
    return torch.where(total != 0, torch.trunc(total / q2) * q2, total)


def dots(q: torch.Tensor, k: torch.Tensor, way: str) -> torch.Tensor:
    """[heads, tokens] raw fp8 dot products (q [heads, 128], k [tokens, 128], as floats)."""
    if way == "mma_sync":
        q, k = q[:, MMA_SYNC_ORDER], k[:, MMA_SYNC_ORDER]
    acc = torch.zeros(q.shape[0], k.shape[0])
    for s in range(DIM // 32):
        products = q[:, None, 32 * s:32 * s + 32] * k[None, :, 32 * s:32 * s + 32]
        acc = acc + slice_sum(products, torch.zeros_like(acc)) if way == "sliced" else slice_sum(products, acc)
    return acc


def shortfalls(inputs: dict[str, torch.Tensor], way: str) -> list[tuple[float, float]]:
    """(worst shortfall of the chosen tokens' sorted true scores, boundary score) per scored row."""
    cache = inputs["k_index_cache_fp8"].view(torch.uint8).reshape(-1, PAGE * (DIM + 4))
    found = []
    for row, length in enumerate(inputs["seq_lens"].tolist()):
        if length <= TOPK:
            continue
        flat = cache[inputs["block_table"][row, : (length + PAGE - 1) // PAGE].long()]
        k = flat[:, : PAGE * DIM].contiguous().view(torch.float8_e4m3fn).float().view(-1, DIM)[:length]
        scale = flat[:, PAGE * DIM:].contiguous().view(torch.float32).reshape(-1)[:length]
        q = inputs["q_index_fp8"][row].float()
        w = inputs["weights"][row].float()
        true = (w[:, None] * torch.relu(q @ k.T)).sum(0) * scale
        model = (w[:, None] * torch.relu(dots(q, k, way))).sum(0) * scale
        want = torch.topk(true, TOPK).values
        got = true[torch.topk(model, TOPK).indices].sort(descending=True).values
        found.append((float((want - got).max()), float(want[-1])))
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="70d53807-f4ba-4c16-a0be-8a1f9137e8e6")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    workload = load_workload("dsa_topk")
    torch.set_grad_enabled(False)
    results: dict[str, list[tuple[float, float]]] = {"chained": [], "mma_sync": [], "sliced": []}
    for seed in range(args.seeds):
        inputs = workload.make_inputs(args.shape, seed, "cpu")
        for way, found in results.items():
            found += shortfalls(inputs, way)
    for way, found in results.items():
        worst = sorted(s for s, _ in found)
        over = sum(s > 0.01 for s in worst)
        print(f"{way:9s} rows {len(worst)}: shortfall median {worst[len(worst) // 2]:.4f}, "
              f"max {worst[-1]:.4f}, above 0.01 in {over}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
