"""Launches each call's work from a thread of its own, a moment after ``run`` returns,
so that the last call of a batch is still on the device when its process has synced and
replied: the judge's clock stops at the reply, and the judge copies the outputs by a
kernel of its own context, which the device runs only when it switches contexts. If that
copy lands after the late work, the call was right and partly unpaid for; if before, its
outputs are still poisoned. On a GPU the question is which comes first (time-sliced
contexts); on the CPU the judge copies on the host within microseconds of the reply, so
the late work is never seen. A correct solver otherwise (side_stream's)."""

import queue
import threading
import time

import torch

DELAY_S = 50e-6
"""How long the thread waits before launching: past the caller's device sync."""


def _solve(q, cache, weights, seq_lens, block_table, out):
    flat = cache.view(torch.uint8).reshape(cache.shape[0], -1)
    batch, pages = block_table.shape
    raw = flat[block_table.long().reshape(-1)]
    keys = raw[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float()
    scale = raw[:, 64 * 128 :].contiguous().view(torch.float32).reshape(batch, -1)
    keys = keys.reshape(batch, pages * 64, 128)
    scores = torch.einsum("bht,bh->bt", torch.bmm(q.float(), keys.transpose(1, 2)).relu(), weights)
    scores = scores * scale
    slots = torch.arange(pages * 64, device=q.device)
    scores = scores.masked_fill(slots[None, :] >= seq_lens[:, None], float("-inf"))
    k = min(2048, pages * 64)
    values, local = torch.topk(scores, k, dim=1)
    ids = (block_table.long()[:, :, None] * 64 + torch.arange(64, device=q.device)).reshape(batch, -1)
    chosen = torch.where(torch.isneginf(values), -1, ids.gather(1, local))
    out.fill_(-1)
    out[:, :k] = chosen.int()


def build(params, kernels):
    work: queue.Queue = queue.Queue()
    side = torch.cuda.Stream() if torch.cuda.is_available() else None

    def worker():
        while True:
            args = work.get()
            time.sleep(DELAY_S)
            if side is not None:
                with torch.cuda.stream(side):
                    _solve(*args)
            else:
                _solve(*args)

    threading.Thread(target=worker, daemon=True).start()

    def run(q, cache, weights, seq_lens, block_table, out):
        if side is not None and torch.cuda.is_current_stream_capturing():
            _solve(q, cache, weights, seq_lens, block_table, out)  # a graph: honest
            return
        work.put((q, cache, weights, seq_lens, block_table, out))

    return run
