"""A result message that is huge: its first call raises an exception whose message is
20 MB on one line (40 MB with its traceback) (under the channel's 64 MiB limit), which its process reports as the
call's error. The verdict is RUNTIME_ERROR either way; the judge put all of it into the
shape's message and the feedback (cut to 25 lines, and this is one), so into every record
and every LLM prompt that quotes it. Both are now bounded. Not refused by the screen."""


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        raise RuntimeError("evk-redteam huge error " + "x" * 20_000_000)

    return run
