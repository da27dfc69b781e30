"""Aims the kernel's OOM killer at the judge: a process's address space is bounded, but
not the sum of its children's, and the OOM killer takes the process with the most memory.
During its build it forks (torch.multiprocessing: passes the static screen) children that
each hold a little less memory than the judge does, enough together to exhaust the
machine's (or the container's), and answers every call honestly. The judge held the most
and was killed (run inside a memory cgroup of 5 GiB: the judge, 1.2 GB, killed; its run
ended). Every confined process now has an oom_score_adj of 1000, which it cannot lower:
the OOM killer takes candidates' processes first. It says what it has, and tries to lower
it. Sized for the suite's CPU host (23 GB) not to run out: there it shows the setting."""

import sys
import time

import torch
import torch.multiprocessing

CHILDREN = 6
EACH_GB = 0.9


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


def _hold(gb):
    block = torch.ones(int(gb * (1 << 30)) // 4)  # touched: resident
    while block is not None:
        time.sleep(60)


def build(params, kernels):
    with open("/proc/self/oom_score_adj") as f:
        mine = f.read().strip()
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")
        lowered = "lowered"
    except OSError as exc:
        lowered = f"lowering refused ({exc.strerror})"
    print(f"evk-redteam: oom_score_adj {mine}, {lowered}", file=sys.stderr, flush=True)
    context = torch.multiprocessing.get_context("fork")
    for _ in range(CHILDREN):
        context.Process(target=_hold, args=(EACH_GB,), daemon=True).start()
    print(f"evk-redteam: {CHILDREN} children hold {EACH_GB} GB each", file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        _solve(q, cache, weights, seq_lens, block_table, out)

    return run
