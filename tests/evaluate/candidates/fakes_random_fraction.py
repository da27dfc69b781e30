"""Fakes a random tenth of its calls past the checked ones, on the shapes that need scoring.

Against the judge before red team 3: warm-up calls on repeated inputs returned the cached
(right) answer, so the batch was sized on near-free calls and held all 64 slots, and 2 of
64 slots per batch were checked in full (plus pairs of byte-equal ones); faking 10% of the
timed calls passed 4 runs of 5, faster than honest. Now the warm-up is on fresh inputs and
6 slots per batch are checked. Past its first three calls (the judge's checked ones), each
call is faked with probability FAKE: the last real answer rolled along its columns by a
count of its own (distinct, never poisoned)."""

import random

import torch

FAKE = 0.1


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


def _key(q, weights, seq_lens, block_table):
    return [q.view(torch.uint8).clone(), weights.clone(), seq_lens.clone(), block_table.clone()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


_state = {}


def build(params, kernels):
    rng = random.Random()

    def run(q, cache, weights, seq_lens, block_table, out):
        shape = (out.untyped_storage().data_ptr(), tuple(out.shape), tuple(block_table.shape))
        st = _state.setdefault(shape, {"last": None, "timed": False, "faked": 0, "calls": 0})
        key = _key(q, weights, seq_lens, block_table)
        last = st["last"]
        st["calls"] += 1
        if last is not None and _same(last[0], key):
            out.copy_(last[1])  # a repeat of the call before: its (right) answer
            return
        st["timed"] = st["calls"] > 3
        scoring = block_table.shape[1] * 64 > 2048
        if st["timed"] and scoring and last is not None and rng.random() < FAKE:
            st["faked"] += 1  # a shift of its own: no two fakes are byte-equal
            out.copy_(torch.roll(last[1], st["faked"], dims=1))
            print(f"faked {st['faked']} timed calls", flush=True)
            return
        _solve(q, cache, weights, seq_lens, block_table, out)
        st["last"] = (key, out.clone())

    return run
