"""benchmarks/profile_bank.py: each step of making a bank timed, written as a result."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import profile_bank
from evokernel.workload import load_workload


def test_profile_writes_each_step_per_shape_and_their_totals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    shape = load_workload("dsa_topk").resolve_shapes("smoke")[0]
    assert profile_bank.main(["--workload", "dsa_topk", "--shapes", shape, "--device", "cpu"]) == 0
    [result] = tmp_path.glob("bank-profile-dsa_topk-cpu-*.json")
    document = json.loads(result.read_text())
    steps = {"construct_s", "warm_s", "variants_s", "floor_bytes_s", "twin_s"}
    totals = document["metrics"]["dsa_topk"]["total"]
    assert set(totals) == steps and all(seconds >= 0 for seconds in totals.values())
    rows = pd.read_csv(tmp_path / document["raw"])
    assert list(rows["shape"]) == [shape]
    assert int(rows["variant_count"][0]) >= 2, "the bank made its variants"
    assert sum(rows[step][0] for step in steps) == pytest.approx(sum(totals.values()), abs=0.01)
    assert "cumulative" in result.with_suffix(".txt").read_text()
