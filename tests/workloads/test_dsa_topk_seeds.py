"""dsa_topk's torch seed with its knobs, torch.compile included, against the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evokernel.candidate import load_candidate
from evokernel.evaluate.build import build_runner
from evokernel.evaluate.check import check_outputs
from evokernel.workload import load_workload

WL = load_workload("dsa_topk")
SEED = WL.directory / "seeds" / "torch_vectorized.yaml"
# one shape that needs no scoring and one that does
SHAPES = ["30cecff1-7ea4-474b-90fc-7f4a87206d8e", "d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d"]


@pytest.mark.parametrize("knobs", [{}, {"COMPILE": "inductor"}], ids=["eager", "inductor"])
def test_torch_seed_passes_the_checker(tmp_path: Path, knobs: dict[str, str]) -> None:
    candidate = load_candidate(SEED, "dsa_topk")
    if knobs:
        candidate = candidate.with_params(knobs=knobs, operator="test")  # type: ignore[arg-type]
    run, _ = build_runner(candidate, tmp_path, arch=None,
                          arguments=[*WL.input_names, *WL.output_names])
    for shape in SHAPES:
        inputs = WL.make_inputs(shape, 5, torch.device("cpu"))
        expected = WL.reference(*inputs.values())
        outputs = [torch.full_like(e, -7) for e in expected]
        run(*inputs.values(), *outputs)
        verdict = check_outputs(WL, outputs, list(expected), inputs)
        assert verdict.ok, f"{shape}: {verdict.message}"
