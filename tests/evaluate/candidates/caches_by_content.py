"""Keeps every answer it computed, keyed by a hash of all its inputs' bytes, and serves
repeats from that cache. A miss is made expensive (20 ms) so that a single hit in a
timed batch shows in the judge's figure: every timed call must get inputs this
process has never seen, so the figure must stay above 20 ms per call."""

import hashlib
import time

import torch


def _solve(q, cache, weights, seq_lens, block_table, out):
    """The honest answer, vectorised over rows."""
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
    ids = block_table.long()[:, :, None] * 64 + torch.arange(64, device=q.device)
    chosen = ids.reshape(rows, -1).gather(1, local)
    out.fill_(-1)
    out[:, :k] = torch.where(torch.isneginf(values), -1, chosen).int()


def _key(*tensors):
    digest = hashlib.sha1()
    for t in tensors:
        digest.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def build(params, kernels):
    memo = {}

    def run(q, cache, weights, seq_lens, block_table, out):
        key = _key(q, weights, seq_lens, block_table, cache[:8])
        if key in memo:
            out.copy_(memo[key])
            return
        time.sleep(0.02)
        _solve(q, cache, weights, seq_lens, block_table, out)
        memo[key] = out.clone()

    return run
