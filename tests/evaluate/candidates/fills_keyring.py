"""The accomplice of caches_in_keyring.py (the ``behind`` of its row): it answers the
first shape honestly and fast, so that its batches are large and it sees most of that
shape's input variants (which the judge reuses across processes), and leaves each answer
in the kernel's keyring of its user (``nobody``, every candidate's), where the next
candidate's process finds it. On any other shape it answers wrong and fails at once.
Keyring system calls need ctypes: its row switches the static screen off."""

import ctypes
import hashlib
import platform
import sys

import torch

NAME = b"evk-redteam-answers"
BUDGET = 18000
"""Bytes of answers kept (the quota counts the key's name and payload)."""
_ADD_KEY = {"x86_64": 248, "aarch64": 217}.get(platform.machine(), 248)
_KEY_SPEC_USER_KEYRING = -4


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

    def write(self, payload):
        done = self.libc.syscall(_ADD_KEY, b"user", NAME, payload, len(payload),
                                 _KEY_SPEC_USER_KEYRING)
        if done < 0:
            self.error = f"add_key: errno {ctypes.get_errno()}"
        return done >= 0


def build(params, kernels):
    ring = Keyring()
    table = {}

    def run(q, cache, weights, seq_lens, block_table, out):
        if tuple(block_table.shape) != (1, 1):
            out.fill_(-1)  # fail here: nothing to leave for other shapes
            print(f"evk-redteam: left {len(table)} answers in the keyring "
                  f"({ring.error or 'written'})", file=sys.stderr, flush=True)
            return
        _solve(q, cache, weights, seq_lens, block_table, out)
        chosen = out[0][out[0] >= 0] - block_table[0, 0] * 64
        table[_key(q, weights, seq_lens, block_table)] = bytes(chosen.to(torch.uint8).cpu().tolist())
        blob = b"".join(k + bytes([len(v)]) + v for k, v in table.items())
        if len(blob) <= BUDGET:
            ring.write(blob)

    return run
