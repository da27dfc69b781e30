"""The benchmark's correctness rule for the DSA TopK indexer.

Which tokens are chosen matters, not their order nor how ties are broken, nor the
arithmetic a kernel used to rank them. For each row: every non-padding index must
be reachable through the row's block table at a logical position below its
length, none may repeat, exactly min(2048, length) are valid and the rest are -1.
Then the chosen tokens' scores, recomputed here in float32, sorted, must match the
reference's sorted scores rank by rank (fail only where off by more than atol AND
by more than rtol relative).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from evokernel.evaluate.check import Verdict, mismatches

PAGE = 64
DIM = 128
TOPK = 2048


def row_scores(inputs: Mapping[str, torch.Tensor], row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(global ids, float32 scores) of every valid token of one row, in logical order."""
    length = int(inputs["seq_lens"][row])
    if length <= 0:
        empty = torch.empty(0, device=inputs["seq_lens"].device)
        return empty.long(), empty.float()
    pages = inputs["block_table"][row, : (length + PAGE - 1) // PAGE].long()
    cache = inputs["k_index_cache_fp8"].view(torch.uint8)
    flat = cache.reshape(cache.shape[0], PAGE * (DIM + 4))[pages]
    values = flat[:, : PAGE * DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = flat[:, PAGE * DIM :].contiguous().view(torch.float32)
    keys = (values.view(-1, PAGE, DIM) * scales.view(-1, PAGE, 1)).reshape(-1, DIM)[:length]
    q = inputs["q_index_fp8"][row].float()
    scores = (torch.relu(q @ keys.T) * inputs["weights"][row].float()[:, None]).sum(dim=0)
    offsets = torch.arange(PAGE, device=pages.device)
    ids = (pages[:, None] * PAGE + offsets[None, :]).reshape(-1)[:length]
    return ids, scores


def _validate_row(chosen: torch.Tensor, ids: torch.Tensor, length: int, who: str, row: int) -> str:
    """Empty string if the row's indices are valid, else why not."""
    padding = chosen < 0
    if bool((chosen[padding] != -1).any()):
        return f"{who} row {row}: negative index other than -1"
    valid = chosen[~padding]
    want = min(TOPK, max(length, 0))
    if valid.numel() != want:
        return f"{who} row {row}: {valid.numel()} valid indices, expected {want} (seq_len {length})"
    if torch.unique(valid).numel() != valid.numel():
        return f"{who} row {row}: duplicate indices"
    if valid.numel() and not bool(torch.isin(valid, ids).all()):
        bad = valid[~torch.isin(valid, ids)][0].item()
        return f"{who} row {row}: index {bad} is not reachable within seq_len {length}"
    return ""


def _scores_of(chosen: torch.Tensor, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(ids)
    positions = torch.searchsorted(ids[order], chosen)
    return scores[order][positions]


def check(
    outputs: Sequence[torch.Tensor],
    reference_outputs: Sequence[torch.Tensor],
    inputs: Mapping[str, torch.Tensor],
    *,
    atol: float = 0.01,
    rtol: float = 0.01,
) -> Verdict:
    (out,) = outputs
    (ref,) = reference_outputs
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        return Verdict.fail(
            f"topk_indices: {tuple(out.shape)} {out.dtype}, expected {tuple(ref.shape)} {ref.dtype}"
        )
    out, ref = out.long(), ref.long()
    worst_abs = worst_rel = 0.0
    for row in range(out.shape[0]):
        length = int(inputs["seq_lens"][row])
        ids, scores = row_scores(inputs, row)
        for who, chosen in (("output", out[row]), ("reference", ref[row])):
            problem = _validate_row(chosen, ids, length, who, row)
            if problem:
                return Verdict.fail(problem)
        got = _scores_of(out[row][out[row] >= 0], ids, scores).sort(descending=True).values
        want = _scores_of(ref[row][ref[row] >= 0], ids, scores).sort(descending=True).values
        if got.numel() == 0:
            continue
        diff = (got.double() - want.double()).abs()
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / (want.double().abs() + 1e-8)).max()))
        bad = mismatches(got, want, atol, rtol)
        if bool(bad.any()):
            rank = int(bad.nonzero()[0])
            return Verdict.fail(
                f"row {row}: selected scores differ from the reference's at {int(bad.sum())} "
                f"ranks; first at rank {rank}: {got[rank].item():.6g} vs {want[rank].item():.6g}",
                max_abs_error=worst_abs, max_rel_error=worst_rel,
            )
    return Verdict(True, stats={"max_abs_error": worst_abs, "max_rel_error": worst_rel})
