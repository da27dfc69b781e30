"""Correct (torch_loop's solver), but at build it starts four child processes of its own
(argv marked ``evk-redteam``) that spin on the CPU until the candidate's namespace is
killed: work left behind for the next candidate, aimed at its clock. A used process is
killed in the background while the next candidate loads; with two evaluations in flight
(``SandboxConfig.pipeline``) the next one loads during this one's checks, too. The next
candidate must be clocked only once these are gone (tests/evaluate/test_pipeline.py)."""

import subprocess
import sys

import torch

SPIN = "while True: pass"
_children = []


def build(params, kernels):
    for _ in range(4):
        _children.append(subprocess.Popen([sys.executable, "-c", SPIN, "evk-redteam-spin"]))
    print("cpu spinners started", flush=True)

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
