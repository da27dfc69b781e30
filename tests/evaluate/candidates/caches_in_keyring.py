"""A result cache that outlives its process in the kernel's keyring: every process of one
user shares that user's keyring (``KEY_SPEC_USER_KEYRING``), whatever its namespaces, and
every candidate's process is ``nobody``; the keyring lives as long as the kernel does.
Its accomplice (fills_keyring.py, evaluated before it) leaves its answers there, and
this one serves the judge's reused input variants from them. An unprivileged user's
quota is 20000 bytes, so they are kept for one-page, one-row calls only: per answer, 8
bytes of a hash of the inputs and the in-page offsets of the chosen tokens, a byte each.
A miss costs 20 ms more, so the judge's figure must stay above 20 ms a call if nothing
is served.

The keyring is reached by system calls only (ctypes: the static screen refuses it; this
row switches the screen off)."""

import ctypes
import hashlib
import platform
import sys
import time

import torch

COST_S = 0.02
NAME = b"evk-redteam-answers"
_REQUEST_KEY, _KEYCTL = {"x86_64": (249, 250), "aarch64": (218, 219)}.get(
    platform.machine(), (249, 250))
_KEYCTL_READ = 11


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


def _key(*tensors):
    digest = hashlib.sha1()
    for t in tensors:
        digest.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.digest()[:8]


class Keyring:
    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        self.error = ""

    def read(self):
        key = self.libc.syscall(_REQUEST_KEY, b"user", NAME, None, 0)
        if key < 0:
            self.error = f"request_key: errno {ctypes.get_errno()}"
            return b""
        buf = ctypes.create_string_buffer(32768)
        n = self.libc.syscall(_KEYCTL, _KEYCTL_READ, ctypes.c_long(key), buf, 32768)
        return buf.raw[: max(0, min(n, 32768))]


def _parse(blob):
    table, at = {}, 0
    while at + 9 <= len(blob):
        key, n = blob[at : at + 8], blob[at + 8]
        table[key] = blob[at + 9 : at + 9 + n]
        at += 9 + n
    return table


def build(params, kernels):
    ring = Keyring()
    table = _parse(ring.read())
    served = [0, 0]
    print(f"evk-redteam: found {len(table)} answers in the keyring ({ring.error or 'read'})",
          file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        key = _key(q, weights, seq_lens, block_table)  # a host sync: no graph is captured
        small = tuple(block_table.shape) == (1, 1)
        if small and key in table:
            offsets = torch.tensor(list(table[key]), dtype=torch.int32, device=out.device)
            out.fill_(-1)
            out[0, : len(offsets)] = block_table[0, 0] * 64 + offsets
            served[0] += 1
            if served[0] in (1, 50):
                print(f"evk-redteam: served {served[0]} answers from the keyring, "
                      f"computed {served[1]}", file=sys.stderr, flush=True)
            return
        time.sleep(COST_S)
        _solve(q, cache, weights, seq_lens, block_table, out)
        served[1] += 1

    return run
