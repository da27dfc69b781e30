"""Serves answers another candidate's process left in ptys (leaves_answers_in_ptys.py,
the ``behind`` of its row, evaluated right before it and dying while this one loads).

At its build it opens every /dev/pts/N it can see and reads what is buffered there:
lines of a hash of a call's inputs and its answer (up to its last element that is
not -1). A call whose inputs hash to one of
them copies the answer; any other costs ``COST_S`` more than its honest work, so an
honest figure is above that: one below it was served from the other process. With
ptys of its own (a private devpts instance) it finds nothing."""

import hashlib
import os
import sys
import time

import torch

COST_S = 0.02


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


def key_of(*tensors):
    digest = hashlib.sha1()
    for t in tensors:
        digest.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def harvest():
    """Every line buffered in every pty this process can open."""
    table, opened = {}, []
    try:
        names = [n for n in os.listdir("/dev/pts") if n.isdigit()]
    except OSError:
        names = []
    for name in names:
        try:
            fd = os.open(f"/dev/pts/{name}", os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            continue
        opened.append(name)
        data = b""
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        for line in data.split(b"\n"):
            parts = line.split(b" ")
            if len(parts) == 2 and len(parts[0]) == 40:
                try:
                    table[parts[0].decode()] = bytes.fromhex(parts[1].decode())
                except ValueError:
                    continue
    return table, opened


def build(params, kernels):
    table, opened = harvest()
    print(f"evk-redteam: read {len(table)} answers from ptys {opened}", file=sys.stderr, flush=True)
    served = [0]

    def run(q, cache, weights, seq_lens, block_table, out):
        found = table.get(key_of(q, weights, seq_lens, block_table))  # a host sync: no graph
        if found is not None and len(found) <= out.numel() * out.element_size():
            out.fill_(-1)  # what was left out of the line
            kept = torch.frombuffer(bytearray(found), dtype=out.dtype) if found else out[:0]
            out.view(-1)[: kept.numel()] = kept
            served[0] += 1
            if served[0] in (1, 100):
                print(f"evk-redteam: served {served[0]} calls from another candidate's ptys",
                      file=sys.stderr, flush=True)
            return
        time.sleep(COST_S)
        _solve(q, cache, weights, seq_lens, block_table, out)

    return run
