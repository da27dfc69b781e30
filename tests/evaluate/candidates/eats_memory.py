"""Allocates host memory until something stops it."""

import torch


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        hoard = []
        while True:
            hoard.append(torch.ones(1 << 28, dtype=torch.uint8))

    return run
