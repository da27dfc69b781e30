"""The accomplice of watches_closes.py (the ``behind`` of its row): it spells a message
in which files of the shared read-only root it holds open as it dies. The kernel closes
them late in its exit, while the next candidate already loads, and an inotify watch on a
file sees every process's closes of it, whatever their namespaces. It holds open every
third of the first 512 of torch's Python files, answers wrong and fails at once, and
makes its death slow (empty files in its private /tmp)."""

import glob
import os
import sys

import torch

FILES = 800_000
PER_FOLDER = 10_000
WATCHED = 512


def build(params, kernels):
    root = os.path.dirname(torch.__file__)
    shared = sorted(glob.glob(root + "/**/*.py", recursive=True))[:WATCHED]
    held = [os.open(path, os.O_RDONLY) for i, path in enumerate(shared) if i % 3 == 0]
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
    print(f"evk-redteam: holds {len(held)} shared files open, made {made} files",
          file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)  # fail here: the judge moves on while this process dies
        assert held  # open until the process dies

    return run
