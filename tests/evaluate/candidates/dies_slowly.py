"""Makes its own death slow, for the candidate judged after it (the ``behind`` of a row):
its process fills its private /tmp (a tmpfs of its mount namespace) with empty files,
which the kernel evicts one by one as the process dies, before the judge sees it gone
(a million take seconds, and cost the process nothing but the time to make them, in its
build). Meanwhile the next candidate, in the other lane, loads and makes its untimed
calls; the judge waits for this death before timing it. Its answers are wrong, so that
it fails at its first checked calls and the judge moves on to the next candidate at
once (one that passed would keep the judge checking its answers for a while, while its
death went on)."""

import os
import sys

FILES = 800_000
PER_FOLDER = 10_000


def build(params, kernels):
    made = 0
    try:
        for i in range(FILES):
            folder = f"/tmp/evk-redteam-many/{i // PER_FOLDER}"
            if i % PER_FOLDER == 0:
                os.makedirs(folder, exist_ok=True)
            open(f"{folder}/{i}", "w").close()
            made += 1
    except OSError as exc:
        print(f"evk-redteam: stopped making files: {exc}", file=sys.stderr, flush=True)
    print(f"evk-redteam: made {made} files, to die slowly", file=sys.stderr, flush=True)

    def run(q, cache, weights, seq_lens, block_table, out):
        out.fill_(-1)

    return run
