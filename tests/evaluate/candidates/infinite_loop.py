"""Never returns."""


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        while True:
            pass

    return run
