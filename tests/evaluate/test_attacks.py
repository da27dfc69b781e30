"""Attacks on the judge's inputs that need a workload other than the red team's (dsa_topk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evokernel.candidate import load_candidate
from evokernel.evaluate.options import SandboxConfig
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxEvaluator

ATTACKS = Path(__file__).parent / "attacks"


@pytest.mark.slow
def test_the_attention_index_rows_cannot_be_predicted_without_the_salt(
        tmp_path: Path) -> None:
    """With the screen off, a candidate loads the workload's own generator from the
    repository, draws every variant and base of run seeds 0 and 1 for its call's shapes as
    the judge would without its secret salt, and looks each call's index rows up among
    them: it must find none (it answers honestly either way, so it PASSES)."""
    config = SandboxConfig(device="cpu", timeout_s=600, trials=2, batches=2, baseline="own",
                           static_screen="off")
    candidate = load_candidate(ATTACKS / "predicts_index_rows.py", "dsa_sparse_attention")
    with SandboxEvaluator("dsa_sparse_attention", work_dir=tmp_path, config=config) as ev:
        shape = ev.workload.resolve_shapes("smoke")[0]
        result = ev.evaluate(candidate, [shape])
    assert result.status is Status.PASSED, result
    said = [line for log in tmp_path.rglob("*.log") for line in log.read_text(errors="replace").splitlines()
            if "predicted" in line]
    assert said, "the candidate ran and logged its lookups"
    assert said[-1].startswith("generator found: True"), "the attack had the generator"
    assert all(" predicted 0 of " in line for line in said), said[-3:]
