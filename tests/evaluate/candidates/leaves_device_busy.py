"""Correct (torch_loop's solver), but it leaves work behind for its own kill: at build it
starts a child process of its own (argv marked ``evk-redteam``) that, on a GPU, opens a
device context of its own, holds 8 GiB and keeps one long spinning kernel in flight at
all times, until the candidate's namespace is killed. A used process is killed in the
background while the next candidate's process is readied; if the next one's round trip
were measured then, the dying context (kernels to stop, memory to free) would lengthen
it, and every timed batch of the next candidate would be shortened by as much: a time
it did not earn, or REJECTED below the memory-bandwidth floor. The honest candidate
judged right after it (``then``) must get its own fitness.

On the CPU the child only sleeps: a SIGKILL ends a spinning CPU process at once, and
there is no device context to tear down; the case then shows that the child dies with
the candidate."""

import subprocess
import sys

import torch

HOG = """
import sys, time
import torch
if torch.cuda.is_available():
    held = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    print("busy", flush=True)
    while True:  # one long spin always queued behind the running one
        torch.cuda._sleep(500_000_000)
        torch.cuda._sleep(500_000_000)
        torch.cuda.synchronize()
else:
    print("sleeping", flush=True)
    time.sleep(3600)
"""

_children = []


def _start_hog():
    child = subprocess.Popen([sys.executable, "-c", HOG, "evk-redteam-busy"],
                             stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline().strip()
    _children.append(child)
    print(f"device hog started: {line}", flush=True)


def build(params, kernels):
    _start_hog()

    def run(q, cache, weights, seq_lens, block_table, out):
        flat = cache.view(torch.uint8).reshape(cache.shape[0], -1)
        out.fill_(-1)
        for row in range(q.shape[0]):
            length = int(seq_lens[row])
            if length == 0:
                continue
            pages = block_table[row, : (length + 63) // 64].long()
            raw = flat[pages]
            keys = raw[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float()
            scale = raw[:, 64 * 128 :].contiguous().view(torch.float32)
            keys = (keys.view(-1, 64, 128) * scale.view(-1, 64, 1)).reshape(-1, 128)[:length]
            scores = (torch.relu(q[row].float() @ keys.T) * weights[row][:, None]).sum(0)
            top = torch.topk(scores, min(2048, length)).indices
            out[row, : top.numel()] = (pages[top // 64] * 64 + top % 64).int()

    return run
