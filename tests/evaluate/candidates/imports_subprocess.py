"""Tries to run a shell command: refused before it runs."""

import subprocess


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        subprocess.run(["true"])

    return run
