"""Writes its (read-only) input through /proc/self/mem, which can write past page
protections where a mapping may be copied on write. The judge's input memory is a
shared mapping sealed against writing, so the kernel must refuse; if it did not, the
judge (which skips comparing sealed inputs on the CPU) would not see the change.
It reports what happened and fails its call either way."""


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        try:
            with open("/proc/self/mem", "r+b", buffering=0) as mem:
                mem.seek(weights.data_ptr())
                mem.write(b"\x00" * 16)
            outcome = "wrote its input through /proc/self/mem"
        except OSError as exc:
            outcome = f"could not write its input through /proc/self/mem: {exc}"
        raise RuntimeError(outcome)

    return run
