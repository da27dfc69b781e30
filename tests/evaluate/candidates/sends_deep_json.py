"""Breaks the judge rather than the checks: its process's socket is the file descriptor
named in its argv, and a message on it is a length and JSON. During its build it writes
one message, well framed and under the size limit, that is 100000 nested arrays. Python's
JSON decoder runs out of recursion on it, a RecursionError, not a decoding error: the
judge's evaluation raised instead of giving a verdict (and a search's runtime would record
an evaluator crash). Nothing here is refused by the static screen."""

import os
import struct
import sys

DEPTH = 100_000


def build(params, kernels):
    payload = b"[" * DEPTH + b"]" * DEPTH
    print("evk-redteam: sent nested arrays", file=sys.stderr, flush=True)  # before: killed after
    os.write(int(sys.argv[1]), struct.pack("<I", len(payload)) + payload)

    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)

    return run
