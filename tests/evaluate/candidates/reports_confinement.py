"""Not an attack: says, in its log, what its process sees of the host when its code
first runs (tests/evaluate/test_zygote.py compares it with a fresh interpreter's). Its
answer is padding only: INCORRECT, but loaded and called like any candidate."""

import json

from evokernel.evaluate.isolation import observe

print("EVOKERNEL-OBSERVED " + json.dumps(observe()), flush=True)


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)

    return run
