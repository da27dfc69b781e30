"""Stops the judge's clock early: during its first call it finds the request being served
(in its callers' frames) and the judge's socket (through the garbage collector: every
socket object it finds), answers the current call honestly,
and a moment later (from a thread, after the honest reply) writes a reply to the *next*
request before that request exists. If the judge took it, its next measurement would end
before the work began: a request's nonce and a check for anything sent out of turn stop it."""

import gc
import json
import socket
import struct
import sys
import threading
import time

import torch


def _solve(q, cache, weights, seq_lens, block_table, out):
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


def build(params, kernels):
    sent = []

    def run(q, cache, weights, seq_lens, block_table, out):
        _solve(q, cache, weights, seq_lens, block_table, out)
        if not sent:
            frame, request = sys._getframe(), None
            while frame is not None and request is None:
                found = frame.f_locals.get("request")
                request = found if isinstance(found, dict) and "token" in found else None
                frame = frame.f_back
            # every socket object the interpreter holds: a process forked from a server
            # also holds the server's, whose descriptors are closed; the forgery goes out
            # on each one that still takes it
            sockets = [o for o in gc.get_objects() if isinstance(o, socket.socket)]
            forged = json.dumps({"token": request["token"], "seq": request["seq"] + 1,
                                 "nonce": request.get("nonce"), "graph": False}).encode()
            def later() -> None:
                time.sleep(0.002)
                for sock in sockets:
                    try:
                        sock.sendall(struct.pack("<I", len(forged)) + forged)
                    except OSError:
                        continue

            threading.Thread(target=later).start()
            sent.append(True)

    return run
