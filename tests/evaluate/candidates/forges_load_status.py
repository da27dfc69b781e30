"""Says its own verdict: the reply to ``load`` may carry a status (BUILD_FAILED, or
SKIPPED where a CUDA candidate meets a CPU), and the judge took any status it named. Its
build patches the process's channel (the static screen refuses importing the evaluator;
with the screen off) so that the reply to ``load`` says PASSED, with resources that are
not a table. A PASSED evaluation with no shapes is invalid: the judge's evaluation
raised instead of giving a verdict."""

import sys

from evokernel.evaluate import channel


def build(params, kernels):
    original = channel.Channel.send

    def send(self, message, fds=()):
        if "resources" in message:  # the reply to load
            message = {**message, "status": "PASSED", "message": "all good",
                       "resources": [1, 2, 3]}
            channel.Channel.send = original
        return original(self, message, fds)

    channel.Channel.send = send
    print("evk-redteam: load reply rewritten", file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)

    return run
