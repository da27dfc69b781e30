"""Aimed at the judge's deferred checks: since the merge that overlapped them, the full
checks of every step after the checked calls wait until the candidate's last shape and
run while its process reports CUPTI and is killed, so for a whole evaluation its kept
answers sit unchecked while it still runs. This one answers its first calls of each
shape honestly (the checked calls, checked at once), then every call cheaply: a
plausible answer that passes the screen (every element written, guards intact), timed
as the call; a thread of its own, once the process has gone quiet for a moment (its
reply sent), writes the right answer over each cheap one. If the judge's later check
read the shared outputs (they stay mapped until the scrub after the kill) rather than
its own copies taken at the reply, every answer it looked at would be right, and the
calls timed would have cost next to nothing. The judge copies at the reply: the cheap
answers are what it checks, in the sampled slots of the first warm-up batch.

On a GPU the graph is captured honestly (a thread's work cannot be captured), so the
timed replays are honest; the eager warm-up batches and CUPTI calls are not."""

import sys
import threading
import time

import torch

HONEST_CALLS = 3
"""Calls per shape answered honestly: the judge's checked calls (2 or 3) come first."""
QUIET_S = 0.005
"""How long no call must have come before the thread corrects: past the reply."""


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


def build(params, kernels):
    calls: dict[tuple, int] = {}
    owed: list[tuple] = []
    last = [time.monotonic()]
    lock = threading.Lock()
    side = torch.cuda.Stream() if torch.cuda.is_available() else None

    def corrector() -> None:
        told = False
        while True:
            time.sleep(QUIET_S / 5)
            with lock:
                if not owed or time.monotonic() - last[0] < QUIET_S:
                    continue
                work = owed[:]
                owed.clear()
            if not told:  # said first: the judge may kill the process mid-correction
                told = True
                print(f"evk-redteam: correcting {len(work)} outputs after the reply",
                      file=sys.stderr, flush=True)
            for args in work:  # the same views: whatever inputs the slot holds now
                if side is not None:
                    with torch.cuda.stream(side):
                        _solve(*args)
                    side.synchronize()
                else:
                    _solve(*args)

    threading.Thread(target=corrector, daemon=True).start()

    def run(q, cache, weights, seq_lens, block_table, out):
        key = (tuple(q.shape), tuple(block_table.shape))
        calls[key] = calls.get(key, 0) + 1
        if calls[key] <= HONEST_CALLS or (side is not None and torch.cuda.is_current_stream_capturing()):
            _solve(q, cache, weights, seq_lens, block_table, out)
            return
        out.fill_(-1)
        out[:, :1] = block_table[:, :1] * 64  # every element written: the screen passes
        with lock:
            owed.append((q, cache, weights, seq_lens, block_table, out))
            last[0] = time.monotonic()

    return run
