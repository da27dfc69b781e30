"""Saved populations: a run's elites saved, then seeding another run that evaluates them again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evokernel import search
from evokernel.evaluate.result import Evaluation
from evokernel.populations.saved import PopulationError, load, resolve

FAKE = str(Path(__file__).resolve().parents[1] / "fake_run.yaml")


def journal(run: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pop")
    code = search.main(["--config", FAKE, "--budget", "20", "--run-dir", str(root / "run"), "--quiet",
                        "--set", "output.top=5", "--save-population", str(root / "pops" / "elites")])
    assert code == 0
    return root


def test_the_elites_are_saved_with_what_they_came_from(saved: Path) -> None:
    pop = load(saved / "pops" / "elites")
    assert pop.workload == "fake" and len(pop.members) == 5
    statuses = [m.evaluation.status.value for m in pop.members]
    assert set(statuses) <= {"PASSED", "SKIPPED"}
    keys = [m.evaluation.rank_key() for m in pop.members]
    assert keys == sorted(keys, reverse=True)  # best first
    ranked = sorted(journal(saved / "run"), key=lambda r: Evaluation.model_validate(r["evaluation"]).rank_key())
    assert pop.members[0].candidate.id == ranked[-1]["id"]
    data = json.loads((saved / "pops" / "elites" / "population.json").read_text())
    assert data["format"] == 1 and data["source"]["run"] == str(saved / "run")
    assert data["members"][0]["environment"]["gpu"] == "fake-gpu"
    assert "kernel.py" in data["members"][0]["candidate"]["sources"]
    assert "--from-population populations/elites" in (saved / "pops" / "elites" / "README.md").read_text()


def test_a_saved_population_seeds_another_run_that_judges_it_again(saved: Path, tmp_path: Path) -> None:
    pop = load(saved / "pops" / "elites")
    run = tmp_path / "next"
    code = search.main(["--config", FAKE, "--budget", "12", "--run-dir", str(run), "--quiet", "--seed", "5",
                        "--shapes", "all", "--from-population", str(saved / "pops" / "elites")])
    assert code == 0
    rows = journal(run)
    first = rows[: len(pop.members)]
    assert [r["id"] for r in first] == [m.candidate.id for m in pop.members]  # the seeds, in order
    assert all(r["gen"] == 0 and r["candidate"]["operator"] == "seed" for r in first)
    assert all(len(r["evaluation"]["shapes"]) == 3 for r in first)  # evaluated again, on 'all'
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["population"]["members"] == [m.candidate.id for m in pop.members]
    assert manifest["population"]["sha256"] == pop.sha256
    assert search.main(["--resume", str(run), "--budget", "16", "--quiet"]) == 0  # seeds come from the run
    assert len(journal(run)) == 16


def test_population_errors_are_one_line_and_come_before_the_run(saved: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--config", FAKE, "--budget", "6", "--quiet"]
    assert search.main([*base, "--run-dir", str(tmp_path / "a"), "--save-population",
                        str(saved / "pops" / "elites")]) == 2
    assert "already exists" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert search.main([*base, "--run-dir", str(tmp_path / "b"), "--from-population", str(tmp_path / "none")]) == 2
    assert "is not a saved population" in capsys.readouterr().err and not (tmp_path / "b").exists()
    assert search.main([*base, "--run-dir", str(tmp_path / "c"), "--from-population", str(saved / "pops" / "elites"),
                        "--set", "workload=dsa_topk", "--set", "workload_loader=evokernel.workload:load_workload"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds fake kernels, not dsa_topk" in err and "\n" not in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "population.json").write_text('{"kind": "evokernel-population", "format": 1, "members": [{}]}')
    with pytest.raises(PopulationError, match="is corrupt"):
        load(bad)


def test_names_resolve_under_populations() -> None:
    assert resolve("elites") == Path("populations/elites")
    assert resolve("somewhere/elites") == Path("somewhere/elites")
