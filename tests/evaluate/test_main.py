"""``python -m evokernel.evaluate``: bad input is one line and status 2; a candidate,
including the JSON a search writes, gets its table, its verdict and its status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evokernel.evaluate.__main__ import main
from evokernel.workload import load_workload

WORKLOAD = load_workload("dsa_topk")
SEED = WORKLOAD.directory / "seeds" / "torch_vectorized.yaml"


@pytest.mark.parametrize("argv, message", [
    (["--workload", "nope", "--candidate", str(SEED)], "nope"),
    (["--workload", "dsa_topk", "--candidate", "missing.yaml"], "does not exist"),
    (["--workload", "dsa_topk", "--candidate", str(SEED), "--shapes", "smoke,not-a-shape"], "not-a-shape"),
])
def test_bad_input_is_one_line_and_status_2(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_a_missing_entry_point_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.py").write_text("import torch\ndef builder(params, kernels):\n    return None\n")
    assert main(["--workload", "dsa_topk", "--candidate", str(tmp_path / "k.py")]) == 2
    assert "defines no top-level 'build'" in capsys.readouterr().err


def test_a_searchs_candidate_json_is_judged_with_its_table(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """What a search writes (sources inline) is evaluated as it was found; on a CPU the
    table is whole even though stdout is not a terminal, and --json gets the Evaluation."""
    seed = next(s for s in WORKLOAD.seeds() if s.name == "torch_vectorized")
    found = seed.with_params(knobs={"HEAD_REDUCE": "bmm"}, operator="mutate_knobs")
    (tmp_path / "best_candidate.json").write_text(found.model_dump_json())
    shape = WORKLOAD.subsets["smoke"][0]
    status = main(["--workload", "dsa_topk", "--candidate", str(tmp_path / "best_candidate.json"),
                   "--shapes", shape, "--device", "cpu", "--work-dir", str(tmp_path / "work"),
                   "--json", str(tmp_path / "evaluation.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"candidate {found.id}" in out and "status: PASSED" in out and "fitness" in out
    assert "CUPTI speedup" in out and "…" not in out  # every column whole
    recorded = json.loads((tmp_path / "evaluation.json").read_text())
    assert recorded["candidate_id"] == found.id and recorded["status"] == "PASSED"
