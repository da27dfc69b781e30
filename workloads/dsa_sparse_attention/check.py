"""The benchmark's correctness rule for DSA sparse attention, on both outputs.

FlashInfer-Bench's DsaSparseAttentionEvaluator compares ``output`` (bf16) and
``lse`` (float32, base 2) element by element with the reference: an element fails
only if it is off by more than atol AND by more than rtol relative to the
reference, and every element must pass (matched ratio 1.0).

``lse`` is required here. The benchmark lets a value-returning solution omit it, but
a destination-passing one (the only kind evokernel runs) gets both buffers and has
both checked there too; and any split-K kernel computes it anyway to combine its
splits.

Non-finite values are judged strictly, where the benchmark's arithmetic would let
them through (NaN compares false against any threshold): NaN fails anywhere, and an
infinity passes only where the reference has the same one (lse = -inf for a token
with no valid index).

Vectorised over whole tensors; works on CPU and CUDA tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from evokernel.evaluate.check import Verdict, check_signature, mismatches

NAMES = ("output", "lse")


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def compare(
    name: str, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float
) -> tuple[str, float, float]:
    """('' or why ``got`` fails, worst abs error, worst rel error) over finite elements."""
    got64, want64 = got.double(), want.double()
    finite = torch.isfinite(got64) & torch.isfinite(want64)
    same_inf = torch.isinf(got64) & (got64 == want64)
    diff = torch.where(finite, (got64 - want64).abs(), 0.0)
    rel = diff / (want64.abs().where(finite, 1.0) + 1e-8)
    worst_abs = float(diff.max()) if diff.numel() else 0.0
    worst_rel = float(rel.max()) if rel.numel() else 0.0

    nan = torch.isnan(got64)
    if bool(nan.any()):
        return f"{name}: {int(nan.sum())} NaN values; first at {_first(nan)}", worst_abs, worst_rel
    unmatched_inf = ~finite & ~same_inf
    if bool(unmatched_inf.any()):
        at = _first(unmatched_inf)
        return (
            f"{name}: {int(unmatched_inf.sum())} infinite values where the reference differs "
            f"(or the reverse); first at {at}: {got[at].item()} vs {want[at].item()}",
            worst_abs, worst_rel,
        )
    bad = finite & mismatches(got64, want64, atol, rtol)
    if bool(bad.any()):
        at = _first(bad)
        return (
            f"{name}: {int(bad.sum())} of {bad.numel()} elements differ by more than "
            f"atol {atol} and rtol {rtol}; first at {at}: {got[at].item():.6g} vs "
            f"{want[at].item():.6g}",
            worst_abs, worst_rel,
        )
    return "", worst_abs, worst_rel


def check(
    outputs: Sequence[torch.Tensor],
    reference_outputs: Sequence[torch.Tensor],
    inputs: Mapping[str, torch.Tensor],
    *,
    atol: float = 0.01,
    rtol: float = 0.01,
) -> Verdict:
    """Verdict on (output, lse) against the reference's; ``inputs`` are not needed."""
    del inputs
    wrong = check_signature(outputs, reference_outputs, NAMES)
    if wrong is not None:
        return wrong
    worst_abs = worst_rel = 0.0
    for name, got, want in zip(NAMES, outputs, reference_outputs, strict=True):
        problem, abs_error, rel_error = compare(name, got, want, atol, rtol)
        worst_abs, worst_rel = max(worst_abs, abs_error), max(worst_rel, rel_error)
        if problem:
            return Verdict.fail(problem, max_abs_error=worst_abs, max_rel_error=worst_rel)
    return Verdict(True, stats={"max_abs_error": worst_abs, "max_rel_error": worst_rel})
