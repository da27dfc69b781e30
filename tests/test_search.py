"""The command line end to end: kill -9 and resume, errors, exports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
FAKE = str(REPO / "tests" / "fake_run.yaml")


def search(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evokernel.search", "--quiet", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"},
    )


def final_state(run: Path) -> dict:  # type: ignore[type-arg]
    latest = sorted((run / "snapshots").glob("gen-*.json"))[-1]
    data = json.loads(latest.read_text())
    return {"strategy": data["strategy"], "spent": data["spent"], "generation": data["generation"]}


def journal_ids(run: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (run / "journal.jsonl").read_text().splitlines()]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "pipeline"), [("evolutionary", False), ("optuna", False),
                                                    ("evolutionary", True), ("greedy", True)])
def test_kill_9_mid_generation_then_resume_equals_uninterrupted(tmp_path: Path, strategy: str,
                                                                pipeline: bool) -> None:
    common = ["--config", FAKE, "--strategy", strategy, "--budget", "30", "--seed", "7",
              "--set", f"pipeline={str(pipeline).lower()}"]
    full = search(*common, "--run-dir", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "evokernel.search", "--quiet", *common, "--run-dir", str(cut),
         "--set", "evaluator.options.delay_s=0.15"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    journal = cut / "journal.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # 3 seeds + one batch of 4 + 2 of the next: mid-generation
        if journal.exists() and len(journal.read_bytes().splitlines()) >= 9:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 9 <= len(journal_ids(cut)) < 30

    resumed = search("--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    assert final_state(cut) == final_state(tmp_path / "full")
    assert journal_ids(cut) == journal_ids(tmp_path / "full")


def test_exports_and_the_top_table(tmp_path: Path) -> None:
    out = search("--config", FAKE, "--run-dir", str(tmp_path / "r"), "--budget", "14")
    assert out.returncode == 0, out.stderr
    assert "top candidates" in out.stdout
    sol = json.loads((tmp_path / "r" / "best_solution.json").read_text())
    assert set(sol) >= {"name", "definition", "author", "spec", "sources"}
    assert sol["spec"]["entry_point"] == "main.py::run" and sol["spec"]["destination_passing_style"] is True
    assert set(sol["spec"]) >= {"language", "target_hardware", "entry_point", "dependencies"}
    paths = [s["path"] for s in sol["sources"]]
    assert "main.py" in paths and "kernel.py" in paths
    traces = [json.loads(x) for x in (tmp_path / "r" / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 14 * 2  # two shapes in the fake 'quick' subset
    passed = [t for t in traces if t["evaluation"]["status"] == "PASSED"]
    assert passed and "speedup_factor" in passed[0]["evaluation"]["performance"]
    df = pd.read_parquet(tmp_path / "r" / "results.parquet")
    assert len(df) == 14 and {"candidate_id", "status", "fitness", "param.TILE"} <= set(df.columns)


def test_the_generated_wrapper_builds_once_and_forwards(tmp_path: Path) -> None:
    from evokernel.export import solution
    from evokernel.testing import FakeEvaluator, fake_candidate

    cand = fake_candidate(TILE=128)
    sol = solution(cand, FakeEvaluator().evaluate(cand, ["s0"]), "fake_def")
    for src in sol["sources"]:
        (tmp_path / src["path"]).write_text(src["content"])
    ns: dict[str, object] = {"__file__": str(tmp_path / "main.py")}
    exec(compile((tmp_path / "main.py").read_text(), "main.py", "exec"), ns)
    assert ns["run"](1, 2) is None  # type: ignore[operator]
    assert ns["PARAMS"]["TILE"] == 128  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "budget.evalutions=3"], "unknown key 'budget.evalutions'"),
        (["--budget", "0"], "budget.evaluations"),
        (["--set", "strategy=annealing"], "strategy"),
        (["--shapes", "nope"], "no shape subset 'nope'"),
        (["--set", "workload=no_such_workload", "--set", "workload_loader=evokernel.workload:load_workload"],
         "unknown workload 'no_such_workload'"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = search("--config", FAKE, "--run-dir", str(tmp_path / "r"), *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()


def test_unknown_key_in_a_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("population: {islandz: 3}\n")
    out = search("--config", FAKE, "--config", str(bad))
    assert out.returncode == 2 and f"{bad}: unknown key 'population.islandz'" in out.stderr


def test_resume_errors_leave_the_directory_unchanged(tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert search("--config", FAKE, "--run-dir", str(run), "--budget", "10").returncode == 0
    before = tree(run)
    out = search("--resume", str(run), "--strategy", "greedy")
    assert out.returncode == 2 and "cannot change strategy" in out.stderr
    (tmp_path / "plain").mkdir()
    out = search("--resume", str(tmp_path / "plain"))
    assert out.returncode == 2 and "not an evokernel run directory" in out.stderr
    latest = sorted((run / "snapshots").glob("gen-*.json"))[-1]
    latest.write_bytes(latest.read_bytes()[:50])
    before = tree(run)
    out = search("--resume", str(run))
    assert out.returncode == 2 and "corrupt or truncated" in out.stderr
    assert tree(run) == before


def test_resume_with_a_larger_budget_continues(tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert search("--config", FAKE, "--run-dir", str(run), "--budget", "10").returncode == 0
    out = search("--resume", str(run), "--budget", "18")
    assert out.returncode == 0, out.stderr
    assert len(journal_ids(run)) == 18


def test_resume_on_another_environment_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert search("--config", FAKE, "--run-dir", str(run), "--budget", "8").returncode == 0
    config = run / "config.yaml"
    text = config.read_text().replace("options: {}", "options:\n    environment: {gpu: other}")
    assert text != config.read_text()
    config.write_text(text)
    before = tree(run)
    out = search("--resume", str(run), "--budget", "12")
    assert out.returncode == 2 and "--allow-env-change" in out.stderr
    assert tree(run) == before
    out = search("--resume", str(run), "--budget", "12", "--allow-env-change")
    assert out.returncode == 0, out.stderr


def test_gpu_seconds_alone_limits_by_device_time(tmp_path: Path) -> None:
    run = tmp_path / "r"
    out = search("--config", FAKE, "--run-dir", str(run), "--gpu-seconds", "4")
    assert out.returncode == 0, out.stderr
    records = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    spent = sum(r["evaluation"]["device_s"] for r in records)
    assert 4 <= spent < 4 + 0.5 * 4 + 1e-9  # stops within one batch past the budget


@pytest.mark.ray
@pytest.mark.slow
def test_an_auto_batch_keeps_every_evaluator_busy(tmp_path: Path) -> None:
    """Four evaluator actors: an ``auto`` batch becomes 8 (two rounds), a given one stays,
    and ``auto`` pipelining stays off (opt-in); in process too."""
    import yaml

    ray4 = ["--config", FAKE, "--budget", "10", "--set", "runtime.kind=ray", "--set", "runtime.num_cpus=4",
            "--set", "runtime.evaluators=4"]
    auto = search(*ray4, "--set", "batch_size=auto", "--run-dir", str(tmp_path / "auto"), timeout=300)
    assert auto.returncode == 0, auto.stderr
    given = search(*ray4, "--run-dir", str(tmp_path / "given"), timeout=300)  # fake_run.yaml: 4
    assert given.returncode == 0, given.stderr
    auto_config = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert auto_config["batch_size"] == 8
    assert auto_config["pipeline"] is False  # opt-in until pipelined resume is exact at generation ends
    assert yaml.safe_load((tmp_path / "given" / "config.yaml").read_text())["batch_size"] == 4
    local = search("--config", FAKE, "--budget", "6", "--run-dir", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    assert yaml.safe_load((tmp_path / "local" / "config.yaml").read_text())["pipeline"] is False
