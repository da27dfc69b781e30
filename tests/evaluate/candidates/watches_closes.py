"""Reads the message its accomplice (holds_files_open.py, the ``behind`` of its row,
evaluated right before it and dying while this one loads) spelled in which shared files
it held open: an inotify watch on each of the first 512 of torch's Python files sees the
dying process's closes of them. It reports what it saw in its build's failure. inotify is
reached through ctypes (the static screen refuses it; one row switches the screen off)."""

import ctypes
import glob
import os
import struct
import time

import torch

WATCHED = 512
IN_CLOSE_NOWRITE = 0x10
WAIT_S = 3.0


def build(params, kernels):
    libc = ctypes.CDLL(None, use_errno=True)
    watcher = libc.inotify_init1(os.O_NONBLOCK)
    if watcher < 0:
        raise RuntimeError(f"evk-redteam: inotify refused: errno {ctypes.get_errno()}")
    root = os.path.dirname(torch.__file__)
    shared = sorted(glob.glob(root + "/**/*.py", recursive=True))[:WATCHED]
    watches = {libc.inotify_add_watch(watcher, path.encode(), IN_CLOSE_NOWRITE): i
               for i, path in enumerate(shared)}
    time.sleep(WAIT_S)
    closed = set()
    try:
        data = os.read(watcher, 1 << 20)
    except BlockingIOError:
        data = b""
    at = 0
    while at + 16 <= len(data):
        wd, _, _, length = struct.unpack_from("iIII", data, at)
        if wd in watches:
            closed.add(watches[wd])
        at += 16 + length
    spelled = sum(1 for i in closed if i % 3 == 0)
    raise RuntimeError(f"evk-redteam: saw another process close {len(closed)} shared files, "
                       f"{spelled} of them spelling its message")
