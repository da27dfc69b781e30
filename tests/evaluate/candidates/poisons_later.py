"""A cheat aimed at the next candidate: in its first call it overwrites every byte of
every shared chunk it can reach (the key caches, every slot's inputs and outputs, the
padding, for every shape), then fails. Whatever is left must not change the next,
honest candidate's status or fitness: the test evaluates one right after it."""

import torch


def build(params, kernels):
    def run(q, cache, weights, seq_lens, block_table, out):
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage()
                    for t in (q, cache, weights, seq_lens, block_table, out)}
        for storage in storages.values():
            whole = torch.empty(0, dtype=torch.uint8, device=q.device).set_(storage)
            whole.fill_(0x41)
        raise RuntimeError(f"overwrote {len(storages)} shared chunk(s) with 0x41")

    return run
