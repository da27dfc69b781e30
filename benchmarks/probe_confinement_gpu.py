"""Which layer of the candidate's confinement CUDA initialisation tolerates, one by one.

    python benchmarks/probe_confinement_gpu.py      # on the GPU machine

Each row starts a child in the given namespaces, applies the given layers (read-only
root, private /tmp and /dev/shm with re-exposed paths, the unprivileged user), then
creates a CUDA context; prints which combinations work.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

CHILD = r"""
import os, sys
sys.path.insert(0, {root!r})
from evokernel.evaluate import isolation as iso
layers = sys.argv[1].split(",")
if "ro" in layers:
    print("read-only root:", iso._read_only_root())
if "rodev" in layers:  # read-only, /dev included
    print("read-only all:", iso._set_read_only("/", True))
if "rosys" in layers:  # read-only but /dev, /proc and /sys
    iso._set_read_only("/", True)
    for p in ("/dev", "/proc", "/sys"):
        iso._set_read_only(p, False)
if "cover" in layers:
    iso.cover_and_reexpose("nobody" in layers)
if "nobody" in layers:
    os.setgroups([]); os.setgid(iso.NOBODY); os.setuid(iso.NOBODY)
import torch
torch.zeros(1, device="cuda")
print("cuda ok")
"""


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = CHILD.format(root=root)
    base = ["unshare", "--pid", "--fork", "--mount", "--net", "--mount-proc", "--kill-child"]
    rows = []
    for ipc, layers in itertools.product([True], ["", "rodev", "ro", "rosys", "ro,cover,nobody"]):
        argv = [*base, *(["--ipc"] if ipc else []), sys.executable, "-c", code, layers]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
        ok = "cuda ok" in done.stdout
        rows.append((ipc, layers, ok))
        tail = "" if ok else (done.stderr.strip().splitlines() or ["?"])[-1][:160]
        print(f"ipc={ipc!s:5} layers={layers:16s} {'OK ' if ok else 'BAD'} {tail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
