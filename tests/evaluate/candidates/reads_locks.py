"""Reads the message its accomplice (leaves_locks.py, the ``behind`` of its row, evaluated
right before it and dying while this one loads) left in file locks on torch's own
``__init__.py``: it walks the file's locked ranges with ``F_OFD_GETLK`` and reports how
many it saw, and how many of them spell the message, in its build's failure (so the
feedback shows it). With locks that lock nothing, it sees none."""

import fcntl
import os
import struct

import torch

BASE = 1 << 40
LIMIT = 100_000


def build(params, kernels):
    fd = os.open(torch.__file__, os.O_RDONLY)
    seen, spelled, start = 0, 0, 0
    for _ in range(LIMIT):
        probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, 0, 0)
        kind, _, at, length, _ = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))
        if kind == fcntl.F_UNLCK or length <= 0:
            break
        seen += 1
        i = (at - BASE) // 4
        spelled += int(at >= BASE and length == 1 + (i * 7919) % 3)
        start = at + length
    raise RuntimeError(f"evk-redteam: saw {seen} locked ranges of another process, "
                       f"{spelled} spelling its message")
