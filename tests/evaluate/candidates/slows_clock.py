"""Slows every clock it can reach a thousandfold (time.*, its nanosecond forms, CUDA
events) and then takes 20 ms per call: a timer in its own process would say 20 us.
The judge's clock is in another process, so the figure must stay above 20 ms.

On a GPU the 20 ms are spent on the device (a spin of 4e7 cycles, at least 20 ms at the
H200's top clock of 1.98 GHz), so that a replayed CUDA graph, which skips host code,
still holds them."""

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


def _slowed(clock):
    start = clock()
    return lambda: start + (clock() - start) / 1000


def build(params, kernels):
    time.perf_counter = _slowed(time.perf_counter)
    time.monotonic = _slowed(time.monotonic)
    time.time = _slowed(time.time)
    time.process_time = _slowed(time.process_time)
    time.perf_counter_ns = _slowed(time.perf_counter_ns)
    time.monotonic_ns = _slowed(time.monotonic_ns)
    if torch.cuda.is_available():
        elapsed = torch.cuda.Event.elapsed_time
        torch.cuda.Event.elapsed_time = lambda self, end: elapsed(self, end) / 1000
    pause = time.sleep

    def run(q, cache, weights, seq_lens, block_table, out):
        _solve(q, cache, weights, seq_lens, block_table, out)
        if q.is_cuda:
            torch.cuda._sleep(40_000_000)
        else:
            pause(0.02)

    return run
