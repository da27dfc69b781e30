"""The accomplice of reads_answers_from_ptys.py (the ``behind`` of its row): it leaves
its answers where the next candidate's process can read them while this one dies.

A pseudo-terminal's buffers are the kernel's, and /dev/pts was one instance for every
process on the host, whatever its mount namespace: a pty opened here shows there as
/dev/pts/N, and a process of the same user (every candidate's is ``nobody``) may open it
and read what was written into it, for as long as the pty lives (until this process's
files are closed as it dies). This one answers the first shape honestly and fast (so its
batches are large and it sees most of that shape's input variants, which the judge
reuses across processes), and writes each answer, keyed by a hash of its inputs, into
ptys; on any other shape it answers wrong and fails at once. It makes its death slow (a
million empty files in its private /tmp) so that the next candidate loads while its
ptys still exist."""

import fcntl
import hashlib
import os
import sys
import termios

import torch

FILES = 1_000_000
PER_FOLDER = 10_000


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


class Ptys:
    """Lines written into ptys, a new one whenever the last is full."""

    def __init__(self):
        self.held = []
        self.lines = 0

    def _open(self):
        master, slave = os.openpty()
        mode = termios.tcgetattr(slave)
        mode[3] &= ~(termios.ECHO | termios.ICANON | termios.ISIG | termios.IEXTEN)
        termios.tcsetattr(slave, termios.TCSANOW, mode)
        fcntl.fcntl(master, fcntl.F_SETFL, os.O_NONBLOCK)
        self.held.append((master, slave))

    def write(self, line):
        data = line.encode() + b"\n"
        for _ in range(2):
            if not self.held:
                self._open()
            try:
                if os.write(self.held[-1][0], data) == len(data):
                    self.lines += 1
                    return
                os.write(self.held[-1][0], b"\n")  # a part went in: end it (it is dropped)
            except BlockingIOError:
                pass
            self._open()  # full: the line goes into a new one


def build(params, kernels):
    made = 0
    try:
        for i in range(FILES):
            folder = f"/tmp/evk-redteam-many/{i // PER_FOLDER}"
            if i % PER_FOLDER == 0:
                os.makedirs(folder, exist_ok=True)
            open(f"{folder}/{i}", "w").close()
            made += 1
    except OSError as exc:
        print(f"evk-redteam: stopped making files: {exc}", file=sys.stderr, flush=True)
    ptys = Ptys()
    first = []

    def run(q, cache, weights, seq_lens, block_table, out):
        shape = tuple(block_table.shape)
        if not first:
            first.append(shape)
        if shape != first[0]:
            out.fill_(-1)  # fail here: the judge moves on while this process dies
            print(f"evk-redteam: left {ptys.lines} answers in {len(ptys.held)} ptys "
                  f"({made} files made, to die slowly)", file=sys.stderr, flush=True)
            return
        _solve(q, cache, weights, seq_lens, block_table, out)
        flat = out.reshape(-1)
        written = (flat != -1).nonzero()
        kept = flat[: int(written[-1]) + 1] if len(written) else flat[:0]  # the rest is -1
        ptys.write(key_of(q, weights, seq_lens, block_table) + " "
                   + kept.contiguous().view(torch.uint8).cpu().numpy().tobytes().hex())

    return run
