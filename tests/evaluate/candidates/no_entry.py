"""Defines a run but no build factory."""


def run(q, cache, weights, seq_lens, block_table, out):
    out.fill_(-1)
