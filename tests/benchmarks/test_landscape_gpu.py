"""benchmarks/landscape_gpu.py end to end, with a fake judge (and, marked slow, the real one
on the CPU)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from benchmarks import landscape_gpu
from evokernel.analysis.landscape import Landscape
from evokernel.candidate import Candidate
from evokernel.evaluate import sandbox
from evokernel.evaluate.options import SandboxConfig
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing

WORKLOAD = "dsa_sparse_attention"


def latency_us(c: Candidate) -> float:
    return 10.0 + int(c.id[:4], 16) % 50


class FakeSandbox:
    """Stands in for SandboxEvaluator: cuda_mma with BLOCK_N=16 is INCORRECT, the rest pass
    at a latency fixed by the id; ``sigterm_at`` sends this process SIGTERM on that call."""

    sigterm_at: int | None = None
    calls = 0

    last_config: SandboxConfig | None = None
    triton_store: Any = None
    retired = False

    def __init__(self, workload_name: str, *, config: SandboxConfig) -> None:
        assert workload_name == WORKLOAD
        self.config = config
        self.baseline_spent = {"banks_s": 1.0, "judge_s": 2.0, "shapes": 1.0}
        FakeSandbox.calls = 0
        FakeSandbox.last_config = config

    def __enter__(self) -> FakeSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def environment(self) -> dict[str, str]:
        return {"device": "NVIDIA Fake", "baseline": "own (fake)"}

    def wait_retired(self) -> None:
        FakeSandbox.retired = True
        if self.triton_store is not None:  # the last process's kernels land as it retires
            self.triton_store.admitted += 1

    def warmed_ahead(self) -> int:
        return 1

    def warm_up(self, shapes: Sequence[str]) -> dict[str, Timing]:
        return self.baseline_timings(shapes)

    def baseline_timings(self, shapes: Sequence[str]) -> dict[str, Timing]:
        return {}

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        return None

    def evaluate(self, c: Candidate, shapes: Sequence[str]) -> Evaluation:
        FakeSandbox.calls += 1
        if FakeSandbox.calls == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if c.name == "cuda_mma" and c.params["BLOCK_N"] == 16:
            return Evaluation(candidate_id=c.id, status=Status.INCORRECT, feedback="wrong\nmore", shapes=(
                ShapeResult(shape=shapes[0], status=Status.INCORRECT, message="wrong"),))
        ms = latency_us(c) / 1e3
        t = Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=9, method="cuda-graph",
                   cupti_ms=ms / 2)
        ref = t.model_copy(update={"median_ms": 1.0})
        return Evaluation(candidate_id=c.id, status=Status.PASSED, shapes=tuple(
            ShapeResult(shape=s, status=Status.PASSED, timing=t, reference=ref) for s in shapes))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(sandbox, "SandboxEvaluator", FakeSandbox)
    monkeypatch.setattr(FakeSandbox, "sigterm_at", None)
    monkeypatch.setenv("OUT", str(tmp_path))
    return tmp_path


def args(*extra: str) -> list[str]:
    return ["--workload", WORKLOAD, "--seeds", "triton_split,cuda_mma", "--shapes", "smoke",
            "--budget", "600", *extra]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def summary_of(out: Path) -> dict[str, Any]:
    (path,) = out.glob("landscape-*-fake-*.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_writes_the_landscape_and_a_summary_per_seed(fake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert landscape_gpu.main(args("--max-points", "40")) == 0
    landscape = fake / "landscape-dsa_sparse_attention-triton_split+cuda_mma.jsonl"
    records = read_jsonl(landscape)
    assert len(records) == 40 and len({Candidate.model_validate(r["candidate"]).id for r in records}) == 40
    assert Landscape.load(landscape).shapes == tuple(records[0]["shapes"])

    printed = [line for line in capsys.readouterr().out.splitlines() if line[:5].strip().isdigit()]
    assert [int(line.split()[0]) for line in printed] == list(range(1, 41))
    assert printed[0].split()[2] == "triton_split.default" and printed[0].split()[1].endswith("s")

    document = summary_of(fake)
    metrics = document["metrics"][WORKLOAD]["landscape"]
    assert metrics["points"] == 40 and metrics["stopped"] == "--max-points 40 reached"
    assert metrics["count_passed"] + metrics["count_incorrect"] == 40 and metrics["count_incorrect"] > 0
    assert metrics["file"] == landscape.name and document["raw"].endswith(".csv")
    for name in ("triton_split", "cuda_mma"):
        mine = [Candidate.model_validate(r["candidate"]) for r in records
                if r["candidate"]["name"] == name and r["evaluation"]["status"] == "PASSED"]
        best = min(mine, key=latency_us)
        assert metrics[name]["best"]["candidate"] == best.id
        assert metrics[name]["best"]["mean_latency_us"] == pytest.approx(latency_us(best))
        assert metrics[name]["best"]["mean_latency_us_cupti"] == pytest.approx(latency_us(best) / 2)
        assert metrics[name]["default"]["status"] == "PASSED"
    rows = pd.read_csv(fake / document["raw"])
    assert set(rows["status"]) == {"PASSED", "INCORRECT"} and rows["index"].nunique() == 40


def test_a_later_session_adds_new_points_only(fake: Path) -> None:
    assert landscape_gpu.main(args("--max-points", "30")) == 0
    first = fake / "landscape-dsa_sparse_attention-triton_split+cuda_mma.jsonl"
    assert landscape_gpu.main(args("--max-points", "30", "--skip", str(first), "--sample-seed", "9")) == 0
    second = fake / "landscape-dsa_sparse_attention-triton_split+cuda_mma-2.jsonl"
    ids = [{r["evaluation"]["candidate_id"] for r in read_jsonl(p)} for p in (first, second)]
    assert len(ids[0]) == len(ids[1]) == 30 and not ids[0] & ids[1]
    assert len(read_jsonl(first)) == 30  # the earlier file is left as it was


def test_sigterm_stops_the_run_with_everything_written(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeSandbox, "sigterm_at", 4)
    before = signal.getsignal(signal.SIGTERM)
    assert landscape_gpu.main(args()) == 0
    assert signal.getsignal(signal.SIGTERM) == before
    assert len(read_jsonl(fake / "landscape-dsa_sparse_attention-triton_split+cuda_mma.jsonl")) == 3
    metrics = summary_of(fake)["metrics"][WORKLOAD]["landscape"]
    assert metrics["stopped"] == "SIGTERM" and metrics["points"] == 3


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "nope", "--seeds", "x"], "nope"),
    (["--workload", WORKLOAD, "--seeds", "triton_split,nope"], "has no seed 'nope'"),
    (["--workload", WORKLOAD, "--seeds", "cuda_mma,cuda_mma"], "names a seed twice"),
    (["--workload", WORKLOAD, "--seeds", "cuda_mma", "--shapes", "huge"], "no shape subset 'huge'"),
    (["--workload", WORKLOAD, "--seeds", "cuda_mma", "--skip", "/absent.jsonl"], "cannot read landscape"),
    (["--workload", WORKLOAD, "--seeds", "cuda_mma", "--budget", "0"], "must be positive"),
    (["--workload", WORKLOAD, "--seeds", "cuda_mma", "--lanes", "0"], "--lanes must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_status_2(fake: Path, capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], message: str) -> None:
    assert landscape_gpu.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not list(fake.iterdir())  # nothing written


@pytest.mark.slow
def test_a_dry_run_on_the_cpu_through_the_real_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch seeds are timed on the CPU; a Triton seed comes back SKIPPED, still a row."""
    monkeypatch.setenv("OUT", str(tmp_path))
    assert landscape_gpu.main(["--workload", "dsa_topk", "--seeds", "torch_vectorized,triton_score",
                               "--shapes", "smoke", "--budget", "240", "--timeout", "60",
                               "--max-points", "3"]) == 0
    records = read_jsonl(tmp_path / "landscape-dsa_topk-torch_vectorized+triton_score.jsonl")
    statuses = [(r["candidate"]["name"], r["evaluation"]["status"]) for r in records]
    assert statuses[:2] == [("torch_vectorized", "PASSED"), ("triton_score", "SKIPPED")]
    assert len(statuses) == 3 and statuses[2][0] == "torch_vectorized"
    assert Landscape.load(tmp_path / "landscape-dsa_topk-torch_vectorized+triton_score.jsonl").best_fitness


def test_a_trace_folder_without_the_definition_is_exit_status_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "trace" / "definitions").mkdir(parents=True)
    monkeypatch.setenv("EVOKERNEL_TRACE_ROOT", str(tmp_path / "trace"))
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert landscape_gpu.main(args()) == 2
    assert "no definitions/" in capsys.readouterr().err
    assert not list((tmp_path / "out").iterdir())


def test_the_triton_stores_counts_are_read_once_the_last_process_retired(
        fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeSandbox, "triton_store", SimpleNamespace(admitted=2, offered=3))
    monkeypatch.setattr(FakeSandbox, "retired", False)
    assert landscape_gpu.main(args("--max-points", "2")) == 0
    metrics = summary_of(fake)["metrics"]["dsa_sparse_attention"]["landscape"]
    assert FakeSandbox.retired
    assert metrics["triton_kernels"] == {"admitted": 3, "offered": 3, "warmed": 1}
    assert metrics["triton_store"] is True


def test_lanes_bank_memory_quiet_graphs_and_the_triton_store_reach_the_judge(fake: Path) -> None:
    assert landscape_gpu.main(args("--max-points", "1")) == 0
    assert FakeSandbox.last_config is not None and FakeSandbox.last_config.lanes == 2  # the default
    assert FakeSandbox.last_config.quiet_graphs is False and FakeSandbox.last_config.triton_store is True
    assert landscape_gpu.main(args("--max-points", "1", "--lanes", "1", "--bank-memory-gb", "60",
                                   "--quiet-graphs", "--no-triton-store")) == 0
    config = FakeSandbox.last_config
    assert config.lanes == 1 and config.bank_memory_gb == 60 and config.quiet_graphs is True
    assert config.triton_store is False
    assert landscape_gpu.main(args("--max-points", "1", "--no-triton-warm")) == 0
    assert FakeSandbox.last_config.triton_warm_workers == 0
