"""Fills the judge's disk, a log at a time: its output goes to a log file the judge opened
in its run folder, bounded only by the process's file limit (256 MiB), and every process's
log was kept whole. It writes 250 MiB there in its build, then answers honestly: a search
of a few hundred such candidates fills a disk. A dead process's log is now cut to its last
MiB (the judge reads only its last 64 KiB). Printing passes the static screen."""

import sys

import torch


def build(params, kernels):
    line = ("evk-redteam " + "x" * 1011 + "\n") * 1024  # 1 MiB
    for _ in range(250):
        sys.stderr.write(line)
    sys.stderr.flush()
    print("evk-redteam: wrote 250 MiB of log", file=sys.stderr, flush=True)

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
