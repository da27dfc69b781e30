"""Correctness verdicts, and the benchmark's default element-wise rule.

A workload may ship its own ``check`` (dsa_topk does: any top-k set whose scores
match is correct). Where it does not, outputs are compared element by element the
FlashInfer-Bench way: an element fails only if it is off by more than ``atol`` AND
by more than ``rtol`` relative; NaN or Inf fails; shapes and dtypes must match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str = ""
    stats: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def fail(message: str, **stats: float) -> Verdict:
        return Verdict(False, message, dict(stats))


def mismatches(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Boolean mask of elements that fail the abs-AND-rel rule."""
    diff = (actual.double() - expected.double()).abs()
    rel = diff / (expected.double().abs() + 1e-8)
    return (diff > atol) & (rel > rtol)


def check_signature(
    outputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], names: Sequence[str]
) -> Verdict | None:
    """Shape and dtype of every output, or None when they all match."""
    if len(outputs) != len(expected):
        return Verdict.fail(f"expected {len(expected)} outputs, got {len(outputs)}")
    for name, out, ref in zip(names, outputs, expected, strict=True):
        if tuple(out.shape) != tuple(ref.shape):
            return Verdict.fail(f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        if out.dtype != ref.dtype:
            return Verdict.fail(f"{name}: dtype {out.dtype}, expected {ref.dtype}")
    return None


def default_check(
    outputs: Sequence[torch.Tensor],
    reference_outputs: Sequence[torch.Tensor],
    inputs: Mapping[str, torch.Tensor],
    *,
    names: Sequence[str],
    atol: float,
    rtol: float,
) -> Verdict:
    """Element-wise comparison with the reference's outputs."""
    del inputs
    bad = check_signature(outputs, reference_outputs, names)
    if bad is not None:
        return bad
    worst_abs = worst_rel = 0.0
    for name, out, ref in zip(names, outputs, reference_outputs, strict=True):
        if out.is_floating_point() and not torch.isfinite(out).all():
            return Verdict.fail(f"{name}: contains NaN or Inf")
        mask = mismatches(out, ref, atol, rtol)
        diff = (out.double() - ref.double()).abs()
        worst_abs = max(worst_abs, float(diff.max()) if diff.numel() else 0.0)
        rel = diff / (ref.double().abs() + 1e-8)
        worst_rel = max(worst_rel, float(rel.max()) if rel.numel() else 0.0)
        if bool(mask.any()):
            first = tuple(int(i) for i in mask.nonzero()[0])
            return Verdict.fail(
                f"{name}: {int(mask.sum())} of {mask.numel()} elements differ; first at {first}: "
                f"{out[first].item()} vs {ref[first].item()}",
                max_abs_error=worst_abs, max_rel_error=worst_rel,
            )
    return Verdict(True, stats={"max_abs_error": worst_abs, "max_rel_error": worst_rel})


def check_outputs(
    workload: Any,
    outputs: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    inputs: Mapping[str, torch.Tensor],
) -> Verdict:
    """The workload's own rule where it has one, else the element-wise default."""
    tol = workload.tolerance
    if workload.checker is not None:
        verdict: Verdict = workload.checker(outputs, expected, inputs, atol=tol["atol"], rtol=tol["rtol"])
        return verdict
    return default_check(outputs, expected, inputs, names=workload.output_names,
                         atol=tol["atol"], rtol=tol["rtol"])
