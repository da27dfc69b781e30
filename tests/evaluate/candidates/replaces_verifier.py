"""Replaces the verifier from ``build``: every checker it can find in its process (the
evaluator's check_outputs, the workload's checker, torch.equal/allclose) is made to say
yes, then it writes a wrong answer. The old harness checked in the candidate's own
process (H200: PASSED at up to 2818x); now the checks run in the judge's process."""

import sys

import torch


class _Yes:
    def __init__(self):
        self.ok, self.message, self.stats = True, "", {}


def build(params, kernels):
    import evokernel.evaluate.check as check

    check.check_outputs = lambda *a, **k: _Yes()
    for name, module in list(sys.modules.items()):
        if name.startswith("evk_") and hasattr(module, "check"):
            module.check = lambda *a, **k: _Yes()
    torch.equal = lambda *a, **k: True
    torch.allclose = lambda *a, **k: True

    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)
        out[:, :1] = block_table[:, :1] * 64

    return run
