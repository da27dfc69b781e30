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
    assert len(df) == 14 and {"candidate_id", "status", "param.TILE"} <= set(df.columns)
    assert {"fitness_geomean_speedup", "mean_speedup_arithmetic"} <= set(df.columns)
    assert "geometric mean" in df.attrs["columns"]["fitness_geomean_speedup"]


def test_the_generated_wrapper_builds_once_and_forwards(tmp_path: Path) -> None:
    from evokernel.analysis.export import solution
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
        (["--set", "strategy_options.bogus=1"], "unexpected keyword argument 'bogus'"),  # after creation: undone
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
    and ``auto`` pipelining is on; in process (one evaluator) it is off."""
    import yaml

    ray4 = ["--config", FAKE, "--budget", "10", "--set", "runtime.kind=ray", "--set", "runtime.num_cpus=4",
            "--set", "runtime.evaluators=4"]
    auto = search(*ray4, "--set", "batch_size=auto", "--run-dir", str(tmp_path / "auto"), timeout=300)
    assert auto.returncode == 0, auto.stderr
    given = search(*ray4, "--run-dir", str(tmp_path / "given"), timeout=300)  # fake_run.yaml: 4
    assert given.returncode == 0, given.stderr
    auto_config = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert auto_config["batch_size"] == 8
    assert auto_config["pipeline"] is True
    assert yaml.safe_load((tmp_path / "given" / "config.yaml").read_text())["batch_size"] == 4
    local = search("--config", FAKE, "--budget", "6", "--run-dir", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    assert yaml.safe_load((tmp_path / "local" / "config.yaml").read_text())["pipeline"] is False


# -- the run directory: lock, corrupt files, torn lines, what a resume says --------------------

def test_a_second_search_on_a_running_directory_exits_2_and_names_the_holder(tmp_path: Path) -> None:
    run = tmp_path / "r"
    first = subprocess.Popen(
        [sys.executable, "-m", "evokernel.search", "--quiet", "--config", FAKE, "--budget", "12",
         "--run-dir", str(run), "--set", "evaluator.options.delay_s=0.4"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (run / "journal.jsonl").exists() or not (run / "journal.jsonl").read_bytes():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        second = search("--resume", str(run))
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "is in use by process" in lines[0] and f"process {first.pid} " in lines[0]
        again = search("--config", FAKE, "--run-dir", str(run))
        assert again.returncode == 2 and "already exists and is not empty" in again.stderr
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    resumed = search("--resume", str(run))  # the kernel released the lock with the process
    assert resumed.returncode == 0, resumed.stderr
    assert len(journal_ids(run)) == 12 and not (run / "lock.json").exists()


def _garbage_manifest(run: Path) -> None:
    (run / "run.json").write_text('{"format": 1, "seeds": ')


def _manifest_without_seeds(run: Path) -> None:
    data = json.loads((run / "run.json").read_text())
    del data["seeds"]
    (run / "run.json").write_text(json.dumps(data))


def _garbage_config(run: Path) -> None:
    (run / "config.yaml").write_text("strategy: [unclosed\n  budget: {\n")


def _invalid_config(run: Path) -> None:
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("batch_size: 4", "batch_size: -4"))


def _corrupt_snapshot(run: Path) -> None:
    latest = sorted((run / "snapshots").glob("gen-*.json"))[-1]
    latest.write_bytes(latest.read_bytes()[:50])


def _snapshot_without_strategy_state(run: Path) -> None:
    latest = sorted((run / "snapshots").glob("gen-*.json"))[-1]
    data = json.loads(latest.read_text())
    data["strategy"] = {"strategy": "evolutionary"}
    latest.write_text(json.dumps(data))


def _corrupt_journal_line(run: Path) -> None:
    lines = (run / "journal.jsonl").read_bytes().split(b"\n")
    lines[2] = lines[2][:40]
    (run / "journal.jsonl").write_bytes(b"\n".join(lines))


def _corrupt_source(run: Path) -> None:
    seed = json.loads((run / "run.json").read_text())["seeds"][0]
    (run / "sources" / f"{seed}.json").write_text('{"name": 3}')


@pytest.mark.parametrize(("damage", "message"), [
    (_garbage_manifest, "run.json is corrupt or truncated"),
    (_manifest_without_seeds, "run.json is corrupt: no list of seed ids"),
    (_garbage_config, "config.yaml is corrupt: not valid YAML"),
    (_invalid_config, "config.yaml is not a valid run config: batch_size"),
    (_corrupt_snapshot, "corrupt or truncated"),
    (_snapshot_without_strategy_state, "does not hold a valid evolutionary state"),
    (_corrupt_journal_line, "journal.jsonl: line 3 is corrupt"),
    (_corrupt_source, "is corrupt"),
])
def test_a_corrupt_file_is_one_line_exit_2_and_nothing_changes(tmp_path: Path, damage, message: str) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "r"
    assert search("--config", FAKE, "--run-dir", str(run), "--budget", "10").returncode == 0
    damage(run)
    before = tree(run)
    out = search("--resume", str(run), "--budget", "14")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert tree(run) == before


def test_a_torn_last_journal_line_is_redone_and_the_resume_says_from_where(tmp_path: Path) -> None:
    run, whole = tmp_path / "r", tmp_path / "whole"
    assert search("--config", FAKE, "--run-dir", str(whole), "--budget", "18").returncode == 0
    assert search("--config", FAKE, "--run-dir", str(run), "--budget", "15").returncode == 0
    journal = run / "journal.jsonl"
    data = journal.read_bytes()
    journal.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 40])  # cut inside the last line
    out = search("--resume", str(run), "--budget", "18")
    assert out.returncode == 0, out.stderr
    assert "torn last line" in out.stderr and "will be redone" in out.stderr
    assert "ahead of the journal" in out.stderr  # the newest snapshot covered the torn line
    assert "resuming" in out.stderr and "after generation" in out.stderr
    assert journal_ids(run) == journal_ids(whole)
    assert final_state(run) == final_state(whole)


def test_every_run_directory_has_a_summary(tmp_path: Path) -> None:
    run = tmp_path / "r"
    out = search("--config", FAKE, "--run-dir", str(run), "--budget", "10")
    assert out.returncode == 0, out.stderr
    text = (run / "summary.md").read_text()
    assert "geometric mean of the per-shape speedups" in text and "arithmetic mean" in text
    assert "| # | candidate | status | fitness (geomean speedup) | mean speedup (arithmetic) |" in text
    assert "fitness: geometric mean of the per-shape speedups" in " ".join(out.stdout.split())  # the caption


@pytest.mark.slow
def test_kill_9_at_20_random_points_of_a_pipelined_run(tmp_path: Path) -> None:
    """One pipelined run killed with -9 at 20 random moments and resumed after each: the
    same journal and final population as a run never killed. Three kills in four fall a
    random time after the process has journaled something (mid-generation, between a
    generation's last evaluation and its snapshot, during an ask); the others at any time
    (start-up, creating the run directory, exporting)."""
    import random

    common = ["--config", FAKE, "--strategy", "evolutionary", "--budget", "60", "--seed", "7",
              "--set", "pipeline=true", "--set", "batch_size=4"]
    whole = search(*common, "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    run = tmp_path / "cut"
    rng = random.Random(20)

    def journaled() -> int:
        return len((run / "journal.jsonl").read_bytes().splitlines()) if (run / "journal.jsonl").exists() else 0

    kills = 0
    while kills < 20:
        args = ["--resume", str(run)] if (run / "run.json").exists() else \
            [*common, "--run-dir", str(run), "--set", "evaluator.options.delay_s=0.1"]
        proc = subprocess.Popen([sys.executable, "-m", "evokernel.search", "--quiet", *args], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = journaled()
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.05, 2.0))
        else:
            while journaled() == before and proc.poll() is None:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is not None:
            break  # it finished first: fewer kills, asserted below
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills == 20 and journaled() < 60
    assert search("--resume", str(run)).returncode == 0

    def lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
        rows = [json.loads(x) for x in (path / "journal.jsonl").read_text().splitlines()]
        for r in rows:
            del r["time"], r["evaluation"]["wall_s"]
        return rows

    assert lines(run) == lines(tmp_path / "whole")
    assert final_state(run) == final_state(tmp_path / "whole")
    assert not list(tmp_path.glob(".cut.creating-*"))  # what a killed create left is gone
