"""Takes every task the host will give, aimed at the judge rather than at its own verdict:
during its build it starts threads (32 KB stacks, so that its address-space limit is no
bound) until the kernel refuses one, each waiting forever, and a thread that takes any
task freed later; it answers every call honestly. Every process and thread of the host
shares one count of tasks (the pid space, a container's pids limit): with all of them
taken, the judge could start no thread of its own, and the thread that kills a used
process is one. Not refused by the static screen."""

import sys
import threading
import time

import torch

MOST = 20_000
"""Threads it takes at most: past the task limit a confined process has (4096), short of
the host's count (32768 here), so that a machine without that limit is not brought down
by the suite itself (inside a pids cgroup of 2500, the judge could start no thread)."""


def _solve(q, cache, weights, seq_lens, block_table, out):
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


def build(params, kernels):
    forever = threading.Event()
    threading.stack_size(32 * 1024)

    started = [0]

    def keep_taking():  # any task the host frees later (a thread of the judge ending) too
        while started[0] < MOST:
            try:
                threading.Thread(target=forever.wait, daemon=True).start()
                started[0] += 1
            except RuntimeError:
                time.sleep(0.0005)

    threading.Thread(target=keep_taking, daemon=True).start()
    try:
        while started[0] < MOST:
            threading.Thread(target=forever.wait, daemon=True).start()
            started[0] += 1
    except RuntimeError as exc:
        print(f"evk-redteam: stopped starting threads: {exc}", file=sys.stderr, flush=True)
    print(f"evk-redteam: holds {started[0]} threads and takes more", file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        _solve(q, cache, weights, seq_lens, block_table, out)

    return run
