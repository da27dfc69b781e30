"""The benchmark's correctness rule for the DSA TopK indexer, vectorised over rows.

Which tokens are chosen matters, not their order nor how ties are broken, nor the
arithmetic a kernel used to rank them. For each row: every non-padding index must
be reachable through the row's block table at a logical position below its
length, none may repeat, exactly min(2048, length) are valid and the rest are -1.
Then the chosen tokens' scores, recomputed here in float32, sorted, must match the
reference's sorted scores rank by rank (fail only where off by more than atol AND
by more than rtol relative).

The judge runs this on many timed calls per candidate, so every step works on all
rows at once (a few dozen tensor operations, on whatever device the outputs are).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from evokernel.evaluate.check import Verdict, mismatches

PAGE = 64
DIM = 128
TOPK = 2048


def all_scores(inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(global ids, float32 scores) of every logical position of every row.

    Shapes [rows, max_num_pages * 64]; positions at or past a row's length get id -2
    (matches no output) and score -inf.
    """
    table = inputs["block_table"].long()
    rows, width = table.shape
    lengths = inputs["seq_lens"].long().view(rows, 1)
    cache = inputs["k_index_cache_fp8"].view(torch.uint8)
    flat = cache.reshape(cache.shape[0], PAGE * (DIM + 4))[table.reshape(-1)]
    values = flat[:, : PAGE * DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = flat[:, PAGE * DIM :].contiguous().view(torch.float32)
    keys = (values.view(-1, PAGE, DIM) * scales.view(-1, PAGE, 1)).view(rows, width * PAGE, DIM)
    q = inputs["q_index_fp8"].float()  # [rows, heads, dim]
    per_head = torch.relu(torch.bmm(q, keys.transpose(1, 2)))  # [rows, heads, positions]
    scores = (per_head * inputs["weights"].float().unsqueeze(-1)).sum(dim=1)
    offsets = torch.arange(PAGE, device=table.device)
    ids = (table.unsqueeze(-1) * PAGE + offsets).view(rows, width * PAGE)
    valid = torch.arange(width * PAGE, device=table.device).view(1, -1) < lengths
    ids = torch.where(valid, ids, torch.full_like(ids, -2))
    scores = torch.where(valid, scores, torch.full_like(scores, float("-inf")))
    return ids, scores


@torch.no_grad()
def expected(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> tuple[torch.Tensor]:
    """The reference's answer for the judge's expected outputs, all rows at once: the
    top ``min(2048, length)`` tokens of every row by the scores ``all_scores`` computes
    (the ones ``check`` ranks by), -1 after. Ties may be broken differently from the
    reference's; ``check`` does not look at which of two equal scores was taken."""
    inputs = {"q_index_fp8": q_index_fp8, "k_index_cache_fp8": k_index_cache_fp8,
              "weights": weights, "seq_lens": seq_lens, "block_table": block_table}
    ids, scores = all_scores(inputs)
    rows, positions = scores.shape
    out = torch.full((rows, TOPK), -1, dtype=torch.int32, device=scores.device)
    k = min(TOPK, positions)
    if rows == 0 or k == 0:
        return (out,)
    values, local = torch.topk(scores, k, dim=1)
    chosen = ids.gather(1, local)
    out[:, :k] = torch.where(torch.isneginf(values), -1, chosen).to(torch.int32)
    return (out,)


def _first(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0][0])


def _selected(chosen: torch.Tensor, lengths: torch.Tensor,
              by_id: tuple[torch.Tensor, torch.Tensor], scores: torch.Tensor,
              ) -> tuple[torch.Tensor, torch.Tensor, Callable[[str, Sequence[bool]], str]]:
    """Scores of each row's chosen tokens, sorted descending (-inf for padding); which of
    the four index rules some row breaks (a [4] bool tensor: read with the caller's one
    host sync); and a function saying, for the flags read, which row breaks the first.

    The rules, in order: padding is -1 and nothing else negative; exactly
    min(2048, length) valid indices; none repeated; each reachable through the block
    table below the row's length. Every rule is evaluated on every row (no early exit):
    what an earlier rule rejects is only never reported by a later one."""
    padding = chosen < 0
    negative = (padding & (chosen != -1)).any(dim=1)
    want = lengths.clamp(min=0, max=TOPK)
    count = (~padding).sum(dim=1)
    wrong = count != want
    ordered = chosen.masked_fill(padding, -1).sort(dim=1).values
    repeats = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any(dim=1)
    sorted_ids, order = by_id  # each row's ids sorted, and where each came from
    position = torch.searchsorted(sorted_ids, chosen.contiguous()).clamp(max=sorted_ids.shape[1] - 1)
    found = sorted_ids.gather(1, position) == chosen
    unreachable = ~found & ~padding
    picked = scores.gather(1, order.gather(1, position))
    picked = picked.masked_fill(padding, float("-inf"))
    flags = torch.stack([negative.any(), wrong.any(), repeats.any(), unreachable.any()])

    def why(who: str, broken: Sequence[bool]) -> str:
        if broken[0]:
            return f"{who} row {_first(negative)}: negative index other than -1"
        if broken[1]:
            r = _first(wrong)
            return (f"{who} row {r}: {int(count[r])} valid indices, expected {int(want[r])} "
                    f"(seq_len {int(lengths[r])})")
        if broken[2]:
            return f"{who} row {_first(repeats)}: duplicate indices"
        r = _first(unreachable.any(dim=1))
        index = int(chosen[r][unreachable[r]][0])
        return f"{who} row {r}: index {index} is not reachable within seq_len {int(lengths[r])}"

    return picked.sort(dim=1, descending=True).values, flags, why


def check(
    outputs: Sequence[torch.Tensor],
    reference_outputs: Sequence[torch.Tensor],
    inputs: Mapping[str, torch.Tensor],
    *,
    atol: float = 0.01,
    rtol: float = 0.01,
) -> Verdict:
    """The rule on all rows at once, with one host sync where everything passes (the
    flags of every rule and the error statistics read together); a failure is then
    described with a few more."""
    (out,) = outputs
    (ref,) = reference_outputs
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        return Verdict.fail(
            f"topk_indices: {tuple(out.shape)} {out.dtype}, expected {tuple(ref.shape)} {ref.dtype}"
        )
    ids, scores = all_scores(inputs)
    lengths = inputs["seq_lens"].long()
    sorted_ids, order = ids.sort(dim=1)  # the one sort of every position, for both sides
    by_id = (sorted_ids, order)
    got, got_flags, got_why = _selected(out.long(), lengths, by_id, scores)
    want, want_flags, want_why = _selected(ref.long(), lengths, by_id, scores)
    finite = torch.isfinite(want)
    diff = torch.where(finite, (got.double() - want.double()).abs(), torch.zeros_like(want.double()))
    rel = diff / (want.double().abs() + 1e-8)
    bad = mismatches(torch.where(finite, got, want), want, atol, rtol) & finite
    zero = torch.zeros(1, dtype=torch.float64, device=diff.device)
    read = torch.cat([got_flags.double(), want_flags.double(), bad.any().double().view(1),
                      diff.max().view(1) if diff.numel() else zero,
                      rel.max().view(1) if rel.numel() else zero]).tolist()  # the one sync
    got_broken, want_broken = [bool(f) for f in read[0:4]], [bool(f) for f in read[4:8]]
    if any(got_broken):
        return Verdict.fail(got_why("output", got_broken))
    if any(want_broken):
        return Verdict.fail(want_why("reference", want_broken))
    stats = {"max_abs_error": read[9], "max_rel_error": read[10]}
    if read[8]:
        r = _first(bad.any(dim=1))
        rank = int(bad[r].nonzero()[0])
        return Verdict.fail(
            f"row {r}: selected scores differ from the reference's at {int(bad[r].sum())} "
            f"ranks; first at rank {rank}: {got[r, rank].item():.6g} vs {want[r, rank].item():.6g}",
            **stats,
        )
    return Verdict(True, stats=stats)
