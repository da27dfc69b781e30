"""Isolated evaluation on the CPU: good and bad torch candidates get their status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evokernel.candidate import load_candidate
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator, clean_environment
from evokernel.evaluate.timing import TimingConfig

from .redteam import Case, cases_for

HERE = Path(__file__).parent / "candidates"
# One no-scoring shape (1 row, 1 page) and one scoring shape (4 rows, 34 pages).
SHAPES = ["30cecff1-7ea4-474b-90fc-7f4a87206d8e", "d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d"]


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxEvaluator]:
    config = SandboxConfig(
        device="cpu", timeout_s=60, trials=2,
        timing=TimingConfig(warmup=1, iterations=3, e2e_iterations=1),
    )
    work = tmp_path_factory.mktemp("sandbox")
    with SandboxEvaluator("dsa_topk", work_dir=work, config=config) as ev:
        yield ev


def evaluate(evaluator: SandboxEvaluator, name: str, shapes: list[str] = SHAPES):  # type: ignore[no-untyped-def]
    return evaluator.evaluate(load_candidate(HERE / name, "dsa_topk"), shapes)


def test_correct_candidate_passes_with_timing(evaluator: SandboxEvaluator) -> None:
    ev = evaluate(evaluator, "torch_loop.py")
    assert ev.status is Status.PASSED, ev.feedback
    assert ev.fitness is not None and ev.fitness > 0
    assert all(s.timing and s.reference and s.timing.method == "cpu-wallclock" for s in ev.shapes)
    assert ev.environment["device"] == "cpu"


# Cases that need only a bounded time: the hang has a test of its own below.
CPU_CASES = [c for c in cases_for("cpu") if c.expected["cpu"] is not Status.TIMEOUT]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.file)
def test_red_team_gets_its_status(evaluator: SandboxEvaluator, case: Case) -> None:
    shapes = SHAPES[:1] if case.file == "eats_memory.py" else SHAPES
    ev = evaluator.evaluate(load_candidate(case.path, "dsa_topk"), shapes)
    assert ev.status is case.expected["cpu"], ev.feedback
    assert case.says in ev.feedback
    assert ev.fitness is None


def test_hang_times_out_and_the_next_candidate_still_runs(tmp_path: Path) -> None:
    config = SandboxConfig(device="cpu", timeout_s=8, trials=1,
                           timing=TimingConfig(warmup=1, iterations=2, e2e_iterations=1))
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        hung = ev.evaluate(load_candidate(HERE / "infinite_loop.py", "dsa_topk"), SHAPES[:1])
        assert hung.status is Status.TIMEOUT
        good = ev.evaluate(load_candidate(HERE / "torch_loop.py", "dsa_topk"), SHAPES[:1])
        assert good.status is Status.PASSED


def test_wrong_workload_is_rejected(evaluator: SandboxEvaluator) -> None:
    candidate = load_candidate(HERE / "torch_loop.py", "other")
    assert evaluator.evaluate(candidate, SHAPES).status is Status.REJECTED


def test_reference_timings_are_cached_on_disk(evaluator: SandboxEvaluator) -> None:
    first = evaluator.reference_timings(SHAPES)
    assert evaluator._reference_path.exists()
    again = SandboxEvaluator("dsa_topk", work_dir=evaluator.work_dir, config=evaluator.config)
    try:
        assert again.reference_timings(SHAPES) == first
        assert again._counter == 1, "only the environment probe ran, no new reference job"
    finally:
        again.close()


def test_secrets_are_not_passed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("HF_TOKEN", "x")
    monkeypatch.setenv("HARMLESS", "1")
    env = clean_environment()
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env and env["HARMLESS"] == "1"


def test_candidate_cannot_reach_the_network(evaluator: SandboxEvaluator, tmp_path: Path) -> None:
    import socket

    from evokernel.evaluate.sandbox import network_isolation_prefix

    if not network_isolation_prefix():
        pytest.skip("unshare --net is not permitted on this machine")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    source = (HERE / "opens_socket.py").read_text().replace("PORT = 0", f"PORT = {port}")
    (tmp_path / "opens_socket.py").write_text(source)
    ev = evaluator.evaluate(load_candidate(tmp_path / "opens_socket.py", "dsa_topk"), SHAPES[:1])
    assert ev.status is Status.RUNTIME_ERROR, ev.feedback
    with pytest.raises(TimeoutError):
        server.accept()  # nothing ever connected
    server.close()


def test_patched_clocks_do_not_fool_the_timer(evaluator: SandboxEvaluator) -> None:
    ev = evaluate(evaluator, "patches_timer.py", SHAPES[:1])
    assert ev.status is Status.PASSED, ev.feedback
    timing = ev.shapes[0].timing
    assert timing is not None and timing.median_ms >= 50.0, "the 50 ms pause is measured"
    assert ev.device_s > 0.05


def test_policies_forbid_library_topk_and_the_reference(tmp_path: Path) -> None:
    config = SandboxConfig(device="cpu", timeout_s=60, trials=1,
                           timing=TimingConfig(warmup=1, iterations=2, e2e_iterations=1),
                           policies=("no_library_topk", "no_reference"))
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        for name, why in (("uses_library_topk.py", "no_library_topk"),
                          ("calls_reference.py", "no_reference")):
            result = ev.evaluate(load_candidate(HERE / name, "dsa_topk"), SHAPES[:1])
            assert result.status is Status.REJECTED and why in result.feedback
    with pytest.raises(ValueError, match="no policy 'nope'"):
        SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=SandboxConfig(policies=("nope",)))


def test_library_topk_is_allowed_by_default(evaluator: SandboxEvaluator) -> None:
    assert evaluate(evaluator, "uses_library_topk.py", SHAPES[:1]).status is Status.PASSED
