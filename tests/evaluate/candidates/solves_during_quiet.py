"""Aimed at the judge's lanes: the next candidate loads and makes its untimed calls while
the one before it is still being killed, and the judge waits for that death (``quiet``)
before its first timed batch. If the judge wrote that batch's inputs before the wait,
this process could read them, and work on them unclocked, for as long as the wait lasts.

The one before it (dies_slowly.py, its row's ``behind``) makes its death slow. Here, a
thread watches the slots of the shape being judged: when new inputs have sat in them
for a while with no request (a batch's request follows its write at once; a wait does
not), it solves them and keeps the answers; the call on such a slot copies its answer
(after an exact compare of its inputs) instead of working.

Every call costs ``COST_S`` more when it works, so an honest figure is above that: one
below it was solved while the judge's clock was not running."""

import sys
import threading
import time

import torch

GUARD = 1024  # the judge's guard band, in elements, before every output (bank.py)
COST_S = 0.005
"""What working on one call costs (besides the answer itself)."""
IDLE_S = 0.1
"""How long new inputs must have sat in the slots, no call having come, before the
thread solves them: a batch's request follows its write within milliseconds; a wait for
a retiring lasts as long as the death it waits for."""
QUIET_S = 0.5
"""A call after this long without one is logged: the judge waited (for the death)."""


def _solve(q, cache, weights, seq_lens, block_table):
    """The honest answer, vectorised over rows."""
    rows, width = block_table.shape
    pages = cache.view(torch.uint8).reshape(cache.shape[0], -1)[block_table.long().reshape(-1)]
    keys = pages[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float()
    scale = pages[:, 64 * 128 :].contiguous().view(torch.float32).reshape(rows, width * 64)
    logits = torch.bmm(q.float(), keys.reshape(rows, width * 64, 128).transpose(1, 2)).relu()
    scores = torch.einsum("bht,bh->bt", logits, weights) * scale
    position = torch.arange(width * 64, device=q.device)
    scores = scores.masked_fill(position[None, :] >= seq_lens.long()[:, None], float("-inf"))
    k = min(2048, width * 64)
    values, local = torch.topk(scores, k, dim=1)
    ids = block_table.long()[:, :, None] * 64 + torch.arange(64, device=q.device)
    chosen = ids.reshape(rows, -1).gather(1, local)
    out = torch.full((rows, 2048), -1, dtype=torch.int32, device=q.device)
    out[:, :k] = torch.where(torch.isneginf(values), -1, chosen).int()
    return out


def _shifted(t, slots):
    """The same input of the slot ``slots`` further on (same stride as the arrays)."""
    return t.as_strided(t.shape, t.stride(), t.storage_offset() + slots * t.numel())


def build(params, kernels):
    lock = threading.Lock()
    state = {"busy": False, "last": time.monotonic(), "at": None}
    seen = {}      # (shape, slot) -> the weights the thread or a call last saw there
    answers = {}   # (shape, slot) -> (weights, answer), solved by the thread
    tally = {"ahead": 0, "served": 0, "told": False}

    def fresh_slots(shape, slot, slots, weights, seq_lens):
        """Slots holding inputs no call and no solve of this process has seen."""
        found = []
        for other in range(slots):
            w = _shifted(weights, other - slot)
            before = seen.get((shape, other))
            if before is not None and torch.equal(before, w):
                continue
            if int(_shifted(seq_lens, other - slot).min()) < 1:
                continue  # never written by the judge (lengths are >= 1)
            found.append(other)
        return found

    def watcher() -> None:
        while True:
            try:
                watch()
            except Exception as exc:  # a sync during another thread's capture, say
                print(f"evk-redteam: watcher: {type(exc).__name__}", file=sys.stderr, flush=True)
                time.sleep(0.01)

    def watch() -> None:
        noticed = None  # when new inputs were first seen, no call having come since
        while True:
            time.sleep(0.002)
            with lock:
                busy, at, last = state["busy"], state["at"], state["last"]
            if busy or at is None or (noticed is not None and last > noticed):
                noticed = None
                continue
            shape, slot, slots, (q, cache, weights, seq_lens, block_table) = at
            new = fresh_slots(shape, slot, slots, weights, seq_lens)
            if not new:
                noticed = None
                continue
            if noticed is None:
                noticed = time.monotonic()
            if time.monotonic() - noticed < IDLE_S:
                continue  # a batch's request follows its write at once: this is a wait
            for other in new:
                with lock:
                    if state["busy"]:
                        break  # a call came: the judge is asking, not waiting
                inputs = [_shifted(t, other - slot) for t in (q, weights, seq_lens, block_table)]
                w = inputs[1].clone()
                time.sleep(COST_S)
                answer = _solve(inputs[0], cache, *inputs[1:])
                if not torch.equal(w, inputs[1]):
                    continue  # rewritten meanwhile
                seen[(shape, other)] = w
                answers[(shape, other)] = (w, answer)
                tally["ahead"] += 1
            if tally["ahead"] and not tally["told"]:
                tally["told"] = True
                print(f"evk-redteam: solved {tally['ahead']} calls while the judge waited",
                      file=sys.stderr, flush=True)

    threading.Thread(target=watcher, daemon=True).start()

    def run(q, cache, weights, seq_lens, block_table, out):
        size = out.element_size()
        row = (2 * GUARD + out.numel()) * size
        slot = (out.storage_offset() * size - GUARD * size) // row
        slots = out.untyped_storage().nbytes() // row
        shape = tuple(block_table.shape)
        with lock:
            quiet = time.monotonic() - state["last"] if state["at"] is not None else 0.0
            state["busy"] = True
            state["at"] = (shape, slot, slots, (q, cache, weights, seq_lens, block_table))
        if quiet > QUIET_S:
            print(f"evk-redteam: asked again after {quiet:.1f} s of quiet; solved ahead so far: "
                  f"{tally['ahead']}", file=sys.stderr, flush=True)
        try:
            kept = answers.pop((shape, slot), None)
            if kept is not None and torch.equal(kept[0], weights):
                out.copy_(kept[1])  # solved while the judge waited, on these very inputs
                tally["served"] += 1
                if tally["served"] == 1:
                    print("evk-redteam: served a call solved ahead", file=sys.stderr, flush=True)
                return
            if int(seq_lens.min()) < 1:  # a host sync: on a GPU no graph is captured
                raise ValueError("a slot the judge never wrote")
            time.sleep(COST_S)
            out.copy_(_solve(q, cache, weights, seq_lens, block_table))
            seen[(shape, slot)] = weights.clone()
        finally:
            with lock:
                state["busy"] = False
                state["last"] = time.monotonic()

    return run
