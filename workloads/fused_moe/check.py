"""The contest's correctness rule for the FP8 block-scale MoE (FlashInfer-Bench's
low-bit evaluator with the contest flags ``--atol 1 --rtol 0.3
--required-matched-ratio 0.9``).

Shape and dtype must equal the reference's; a NaN or Inf anywhere fails; an element
fails only where it is off by more than ``atol`` AND by more than ``rtol`` relative to
the reference; the output passes when at least 90 % of its elements do not fail. The
90 % is part of the rule, not a tolerance: low-bit kernels quantise intermediates
(FP8 between the GEMMs, for one), and a few elements near zero drift past both bounds.
One pass over the tensors, on whatever device they are on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from evokernel.evaluate.check import Verdict, check_signature

REQUIRED_MATCHED_RATIO = 0.9


def check(
    outputs: Sequence[torch.Tensor],
    reference_outputs: Sequence[torch.Tensor],
    inputs: Mapping[str, torch.Tensor],
    *,
    atol: float = 1.0,
    rtol: float = 0.3,
) -> Verdict:
    del inputs
    bad = check_signature(outputs, reference_outputs, ["output"])
    if bad is not None:
        return bad
    (out,), (ref,) = outputs, reference_outputs
    if not bool(torch.isfinite(out).all()):
        return Verdict.fail(f"output: {int((~torch.isfinite(out)).sum())} NaN or Inf elements")
    # The rule of evokernel.evaluate.check.mismatches, in float32 (exact for bf16 inputs
    # up to the subtraction's rounding) to halve the memory of the largest shapes.
    diff = (out.float() - ref.float()).abs()
    rel = diff / (ref.float().abs() + 1e-8)
    failed = (diff > atol) & (rel > rtol)
    stats = {
        "matched_ratio": 1.0 - float(failed.sum()) / max(failed.numel(), 1),
        "max_abs_error": float(diff.max()) if diff.numel() else 0.0,
        "max_rel_error": float(rel.max()) if rel.numel() else 0.0,
    }
    if stats["matched_ratio"] < REQUIRED_MATCHED_RATIO:
        first = tuple(int(i) for i in failed.nonzero()[0])
        return Verdict.fail(
            f"output: {int(failed.sum())} of {failed.numel()} elements differ beyond atol {atol:g} "
            f"and rtol {rtol:g} (matched {stats['matched_ratio']:.3f} < {REQUIRED_MATCHED_RATIO}); "
            f"first at {first}: {out[first].item():.6g} vs {ref[first].item():.6g}",
            **stats,
        )
    return Verdict(True, stats=stats)
