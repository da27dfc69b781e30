"""The accomplice of reads_locks.py (the ``behind`` of its row): it leaves a message in
file locks for the candidate after it.

An open file description's lock (``F_OFD_SETLK``, or ``flock``) lives until the kernel
releases the file, late in a dying process's exit, and a lock on a file of the shared
read-only root (here torch's own ``__init__.py``, the same inode in every namespace) is
seen by every process that opens the file: ``F_OFD_GETLK`` names the range of the lock
that conflicts, start and length, two numbers a lock. This one takes a few thousand read
locks whose ranges spell a message (a marker and a count: answers would do as well), then
answers wrong and fails at once, and makes its death slow (empty files in its private
/tmp) so that the next candidate loads while the locks still stand."""

import fcntl
import os
import struct
import sys

import torch

FILES = 800_000
PER_FOLDER = 10_000
LOCKS = 2000
BASE = 1 << 40
"""Where the message's ranges start (far past the end of the file: any offset will do)."""


def build(params, kernels):
    fd = os.open(torch.__file__, os.O_RDONLY)
    held = 0
    for i in range(LOCKS):
        start, length = BASE + 4 * i, 1 + (i * 7919) % 3  # the message: each length a digit
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, start, length, 0))
            held += 1
        except OSError:
            break
    made = 0
    try:
        for i in range(FILES):
            folder = f"/tmp/evk-redteam-many/{i // PER_FOLDER}"
            if i % PER_FOLDER == 0:
                os.makedirs(folder, exist_ok=True)
            open(f"{folder}/{i}", "w").close()
            made += 1
    except OSError:
        pass
    print(f"evk-redteam: took {held} locks on {torch.__file__}, made {made} files",
          file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)  # fail here: the judge moves on while this process dies
        assert fd >= 0  # the file (and its locks) stays open until the process dies

    return run
