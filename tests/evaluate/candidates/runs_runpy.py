"""Loads code by name through ``runpy`` (the old screen matched ``subprocess`` and
``ctypes`` as text and missed it): it runs the workload's reference module to get the
answer. The AST screen refuses runpy."""

import os
import runpy


def _reference():
    for folder in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        path = os.path.join(folder, "workloads", "dsa_topk", "reference.py")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError("no reference found")


def build(params, kernels):
    namespace = runpy.run_path(_reference())

    def run(q, cache, weights, seq_lens, block_table, out):
        out.copy_(namespace["run"](q, cache, weights, seq_lens, block_table)[0])

    return run
