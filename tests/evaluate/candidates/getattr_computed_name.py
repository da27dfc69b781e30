"""Reaches ``torch.topk`` by a computed name, ``getattr(torch, "to" + "pk")``, so that
no text pattern sees it (the old regex screen let it by): the AST screen refuses any
attribute access by a computed name."""

import torch


def build(params, kernels):
    pick = getattr(torch, "to" + "pk")

    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)
        lengths = seq_lens.long()
        for row in range(out.shape[0]):
            k = min(int(lengths[row]), out.shape[1])
            local = pick(torch.rand(k), k).indices
            out[row, :k] = (block_table[row].long()[local // 64] * 64 + local % 64).int()

    return run
