"""Aimed at the candidate after it: with lanes, the next candidate loads and makes its
checked calls while this process is still dying, and a dying process holds its memory
until the kernel (on a GPU, the driver tearing its context down) has freed it. This one
takes all the device memory it can get but 2 GiB, which it gives back for its own honest
answers (on the CPU, most of what its address space allows), and so
holds the device's memory through the next candidate's load and first calls: if they
need device memory, they fail for want of it (a RUNTIME_ERROR that is not theirs), and
if the judge's own checks need some, the judge itself may fail. Its row evaluates an
honest candidate right after it (``then``), which must pass as it does alone.

It answers right: a wrong checked call gets its process killed at once, before the
judge moves on (no overlap); a candidate that passes is killed in the background."""

import contextlib
import sys

import torch

CHUNKS = (1 << 30, 64 << 20, 2 << 20)
"""Allocation sizes tried in turn, largest first, until none more fits."""
KEEP = 2 << 30
"""Given back to the device for its own answers: not to its allocator's cache, whose
blocks a CUDA graph's private pool cannot use (keeping 1 GiB in the cache, its own graph
capture ran out of memory on an H100)."""
HOST_BYTES = 5 << 30
"""On the CPU: what it holds (its address space is 8 GB)."""


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


def _grab(device):
    held = []
    if device.type == "cuda":
        for size in CHUNKS:
            while True:
                try:
                    held.append(torch.empty(size, dtype=torch.uint8, device=device))
                except RuntimeError:  # torch.cuda.OutOfMemoryError
                    break
        freed = 0
        while held and freed < KEEP:
            freed += held.pop().numel()
        torch.cuda.empty_cache()  # what was popped goes back to the device
    else:
        with contextlib.suppress(RuntimeError):
            held.append(torch.ones(HOST_BYTES, dtype=torch.uint8))
    return held


def build(params, kernels):
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        # cuBLAS makes its handle (memory of its own, outside torch's cache) at the first
        # matrix product: before the grab, or on a card the grab fills (an H100's 80 GB)
        # this process fails its own first call rather than holding memory for the next
        torch.bmm(torch.ones(1, 1, 1, device=device), torch.ones(1, 1, 1, device=device))
    held = _grab(device)
    total = sum(t.numel() for t in held)
    print(f"evk-redteam: holds {total >> 20} MiB of {device.type} memory", file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        _solve(q, cache, weights, seq_lens, block_table, out)
        assert held  # the memory stays referenced until the process dies

    return run
