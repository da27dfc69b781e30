"""The report on a comparison folder and on a single run: tables, plots, summary, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evokernel.analysis import compare, report, tables
from evokernel.analysis.landscape import grid, record_grid
from evokernel.journal import RunDir
from evokernel.testing import FakeEvaluator, FakeWorkload, fake_engine

FAKE = ["--workload", "fake", "--set", "workload_loader=evokernel.testing:load_fake_workload"]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    landscape = root / "fake_a.jsonl"
    record_grid(grid(FakeWorkload().seeds()[0]), FakeEvaluator(), ["s0"], landscape)
    out = root / "cmp"
    code = compare.main([*FAKE, "--landscape", str(landscape), "--strategies", "ga,random,greedy",
                         "--seeds", "3", "--budget", "12", "--runtime", "local", "--out", str(out),
                         "--quiet", "--no-report"])
    assert code == 0
    return out


def test_comparison_report(comparison: Path, tmp_path: Path) -> None:
    folder = report.build_report(comparison, out=tmp_path / "r", resamples=1000)
    summary = (folder / "summary.md").read_text()
    for heading in ("Evaluations to reach the target", "Rank tests", "How many seeds", "Operators", "Lineage"):
        assert heading in summary
    for png in ("trajectory", "to_target", "operators", "lineage"):
        assert (folder / f"{png}.png").stat().st_size > 10_000
    reach = pd.read_csv(folder / "to_target.csv")
    assert len(reach) == 9  # every run, reached or not
    per = pd.read_csv(folder / "strategies.csv")
    assert list(per["seeds"]) == [3, 3, 3]
    assert (per["reached"] == reach.groupby("strategy", sort=False)["reached"].sum().to_numpy()).all()
    curve = pd.read_csv(folder / "trajectory.csv")
    assert set(curve["strategy"]) == {"evolutionary", "random", "greedy"}
    assert (curve["low"] <= curve["median"] + 1e-12).all() and (curve["median"] <= curve["high"] + 1e-12).all()


def test_unreachable_target_is_censored_not_dropped(comparison: Path, tmp_path: Path) -> None:
    folder = report.build_report(comparison, out=tmp_path / "r", target=1e9, resamples=200)
    reach = pd.read_csv(folder / "to_target.csv")
    assert not reach["reached"].any() and (reach["cost"] == 13).all()
    assert "not reached" in (folder / "summary.md").read_text()


def test_single_run_report(tmp_path: Path) -> None:
    engine = fake_engine(tmp_path / "run", "evolutionary", budget=16, shapes=("s0", "s1"))
    engine.run()
    folder = report.build_report(tmp_path / "run")
    assert {"trajectory.png", "operators.png", "lineage.png", "summary.md", "lineage.csv"} <= \
        {p.name for p in folder.iterdir()}
    chain = pd.read_csv(folder / "lineage.csv")
    assert chain["operator"].iloc[0] == "seed" and chain["step"].iloc[0] == 0
    frame = tables.evaluations(RunDir.open(tmp_path / "run"))
    assert chain["fitness"].iloc[-1] == pytest.approx(frame["fitness"].max())


def test_operator_success_counts() -> None:
    frame = pd.DataFrame({
        "strategy": ["g"] * 4, "seed": [0] * 4, "candidate": ["s", "a", "b", "c"],
        "operator": ["seed", "mut", "mut", "cx"], "parents": ["", "s", "a", "a;zz"],
        "status": ["PASSED", "PASSED", "INCORRECT", "PASSED"], "fitness": [1.0, 2.0, np.nan, 3.0],
    })
    ops = tables.operator_success(frame).set_index("operator")
    assert ops.loc["mut", "children"] == 2 and ops.loc["mut", "passed"] == 1
    assert ops.loc["mut", "improved"] == 1 and ops.loc["mut", "improved_rate"] == 0.5
    assert ops.loc["cx", "judged"] == 0 and np.isnan(ops.loc["cx", "improved_rate"])  # a parent unknown


def test_report_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evokernel.report: error:") and "neither a comparison" in err and "\n" not in err
    assert report.main([str(tmp_path), "--level", "2"]) == 2
    assert report.main([str(tmp_path), "--resamples", "5"]) == 2
