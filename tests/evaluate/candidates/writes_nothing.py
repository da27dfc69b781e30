"""Returns without writing its output: only a poisoned buffer tells."""


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        return None

    return run
