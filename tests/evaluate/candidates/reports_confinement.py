"""Not an attack: says, in its log, what its process sees of the host when its code
first runs (tests/evaluate/test_zygote.py compares it with a fresh interpreter's), then
answers honestly."""

import json

import torch

from evokernel.evaluate.isolation import observe

print("EVOKERNEL-OBSERVED " + json.dumps(observe()), flush=True)


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        rows, width = block_table.shape
        pages = cache.view(torch.uint8).reshape(cache.shape[0], -1)[block_table.long().reshape(-1)]
        keys = pages[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float()
        scale = pages[:, 64 * 128 :].contiguous().view(torch.float32).reshape(rows, width * 64)
        logits = torch.bmm(q.float(), keys.reshape(rows, width * 64, 128).transpose(1, 2)).relu()
        scores = torch.einsum("bht,bh->bt", logits, weights) * scale
        position = torch.arange(width * 64, device=q.device)
        scores = scores.masked_fill(position[None, :] >= seq_lens.long()[:, None], float("-inf"))
        k = min(out.shape[1], width * 64)
        values, local = torch.topk(scores, k, dim=1)
        ids = (block_table.long()[:, :, None] * 64 + torch.arange(64, device=q.device)).reshape(rows, -1)
        chosen = ids.gather(1, local)
        out.fill_(-1)
        out[:, :k] = torch.where(torch.isneginf(values), -1, chosen).int()

    return run
