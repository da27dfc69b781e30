"""On a GPU: every seed passes the quick shapes, and CUDA kernels that fault, hang or
write out of bounds get their status without taking the evaluator down."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from evokernel.candidate import load_candidate
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.workload import load_workload

from .redteam import Case, cases_for, config_for, judge_case, planted_secrets

pytestmark = pytest.mark.gpu
CUDA = Path(__file__).parent / "candidates" / "cuda"
WORKLOAD = load_workload("dsa_topk")


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxEvaluator]:
    config = SandboxConfig(device="cuda", timeout_s=120, baseline="own")
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path_factory.mktemp("gpu"), config=config) as ev:
        yield ev


@pytest.mark.parametrize("seed", WORKLOAD.seeds(), ids=lambda c: c.name)
def test_seed_passes_quick_shapes(evaluator: SandboxEvaluator, seed) -> None:  # type: ignore[no-untyped-def]
    ev = evaluator.evaluate(seed, WORKLOAD.subsets["quick"])
    assert ev.status is Status.PASSED, ev.feedback
    assert ev.fitness is not None and ev.fitness > 1
    assert ev.environment["capability"].startswith(("9.", "10.", "8.", "12."))


GPU_CASES = [c for c in cases_for("cuda") if Status.TIMEOUT not in c.expected["cuda"]]


@pytest.fixture(scope="module")
def redteam_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxEvaluator]:
    with planted_secrets(), SandboxEvaluator(
        "dsa_topk", work_dir=tmp_path_factory.mktemp("redteam"), config=config_for("cuda")
    ) as ev:
        yield ev


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.file)
def test_red_team_case(redteam_evaluator: SandboxEvaluator, case: Case) -> None:
    outcome = judge_case(redteam_evaluator, case, WORKLOAD.subsets["smoke"][:2])
    assert outcome.ok, outcome.problems


def test_hung_kernel_times_out_and_the_next_one_runs(tmp_path: Path) -> None:
    config = SandboxConfig(device="cuda", timeout_s=30, baseline="own", batches=1, cupti_calls=0)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        shape = WORKLOAD.subsets["smoke"][:1]
        hung = ev.evaluate(load_candidate(CUDA / "infinite_loop.yaml", "dsa_topk"), shape)
        assert hung.status is Status.TIMEOUT
        good = ev.evaluate(WORKLOAD.seeds()[0], shape)
        assert good.status is Status.PASSED, good.feedback


def test_side_stream_work_is_never_timed_as_free(evaluator: SandboxEvaluator) -> None:
    """Unjoined side-stream work cannot be captured (so the batch runs eagerly) and its
    outputs are copied only after the candidate's process synchronised the device: it is
    either judged wrong or timed with everything it does."""
    here = Path(__file__).parent / "candidates" / "side_stream.py"
    ev = evaluator.evaluate(load_candidate(here, "dsa_topk"), WORKLOAD.subsets["quick"][-1:])
    if ev.status is Status.PASSED:
        assert all(s.timing and s.timing.method == "judge-eager" for s in ev.shapes)
    else:
        assert ev.status in (Status.INCORRECT, Status.RUNTIME_ERROR), ev.feedback


def test_cuda_seed_timing_has_both_figures(evaluator: SandboxEvaluator) -> None:
    """The judge's figure (graph replay over fresh inputs) and CUPTI's span, which must
    agree with it to be kept; the reference is timed the same way in the same run."""
    seed = next(s for s in WORKLOAD.seeds() if s.name == "cuda_radix")
    ev = evaluator.evaluate(seed, WORKLOAD.subsets["smoke"])
    assert ev.status is Status.PASSED, ev.feedback
    for shape in ev.shapes:
        assert shape.timing is not None and shape.reference is not None
        assert shape.timing.method == "judge-graph", shape.timing
        assert shape.timing.cupti_ms is not None, shape.timing.cupti_note
        assert shape.reference.cupti_ms is not None, shape.reference.cupti_note
        assert shape.speedup_cupti is not None and shape.speedup_cupti > 1
    assert "pid+mount+net" in ev.environment["sandbox"]


def test_cupti_records_read_before_the_checks_keep_both_figures(tmp_path: Path) -> None:
    """``collect_first``: the CUPTI records are read before the deferred checks, the
    process killed after; every shape still gets a believed CUPTI figure, and the next
    candidate's too."""
    config = SandboxConfig(device="cuda", timeout_s=60, baseline="own", collect_first=True)
    seed = next(s for s in WORKLOAD.seeds() if s.name == "cuda_radix")
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        for _ in range(2):  # the second waits for the first's kill, behind the checks
            result = ev.evaluate(seed, WORKLOAD.subsets["smoke"][:2])
            assert result.status is Status.PASSED, result.feedback
            assert all(s.timing and s.timing.cupti_ms is not None for s in result.shapes), \
                [s.timing for s in result.shapes]
            assert "cupti_collect_s" in result.overheads


def test_impossible_speed_is_rejected(tmp_path: Path) -> None:
    """With the bound set absurdly low, an honest kernel looks faster than memory allows:
    it is re-verified, then REJECTED, and has no fitness."""
    config = SandboxConfig(device="cuda", timeout_s=60, baseline="own", batches=1)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        shapes = WORKLOAD.subsets["quick"][-1:]
        ev.baseline_timings(shapes)  # the reference is judged by the same bound: time it first
        ev.judge.config = dataclasses.replace(ev.judge.config, peak_bandwidth_gbps=1e-3)
        seed = next(s for s in WORKLOAD.seeds() if s.name == "cuda_radix")
        result = ev.evaluate(seed, shapes)
        assert result.status is Status.REJECTED and "cannot be real" in result.feedback
        assert result.fitness is None


def test_candidates_load_while_the_last_one_dies_and_are_timed_after(
        evaluator: SandboxEvaluator, monkeypatch: pytest.MonkeyPatch) -> None:
    """With two lanes of shared memory, a candidate's process loads while the one before
    it (another lane) is still being torn down, and the judge times nothing until that
    is over (lanes.py): the overlap is real on a GPU, where a context takes a while to
    die, and no timed batch runs beside a dying process or a scrub."""
    seed = next(s for s in WORKLOAD.seeds() if s.name == "cuda_radix")
    shapes = WORKLOAD.subsets["smoke"][:1]
    evaluator.evaluate(seed, shapes)
    loads: list[bool] = []
    timed: list[bool] = []
    ask, before_batch = evaluator.judge.ask, evaluator.judge.before_batch

    def asked(handle, deadline, op, *rest, **fields):  # type: ignore[no-untyped-def]
        if op == "load":
            loads.append(any(lane.retiring() for lane in evaluator._lanes))
        return ask(handle, deadline, op, *rest, **fields)

    def timing() -> None:
        timed.append(any(lane.retiring() for lane in evaluator._lanes))
        before_batch()

    monkeypatch.setattr(evaluator.judge, "ask", asked)
    monkeypatch.setattr(evaluator.judge, "before_batch", timing)
    results = [evaluator.evaluate(seed, shapes) for _ in range(4)]
    assert all(r.status is Status.PASSED for r in results), [r.feedback for r in results]
    assert any(loads), loads
    assert timed and not any(timed), timed
    assert all("behind_kill_s" in r.overheads for r in results[1:]), results[-1].overheads


def test_a_seed_variants_triton_kernels_are_compiled_ahead(tmp_path: Path) -> None:
    """A knob variant of triton_split handed to ``prepare`` is warmed by a process of its
    own (meta tensors, launches only compiled: triton_warm.py), which the judge keeps in
    the store; the variant's evaluation then passes and its process compiles nothing the
    store lacked (it offers the judge nothing new)."""
    workload = load_workload("dsa_sparse_attention")
    seed = next(s for s in workload.seeds() if s.name == "triton_split")
    variant = seed.with_params(knobs={"BLOCK_N": 32, "FEW_BLOCK_N": 32}, operator="test")
    shapes = workload.subsets["smoke"]
    config = SandboxConfig(device="cuda", timeout_s=300, baseline="own", triton_warm_workers=1)
    with SandboxEvaluator("dsa_sparse_attention", work_dir=tmp_path, config=config) as ev:
        store = ev.triton_store
        assert store is not None, ev.environment()["sandbox"]
        for shape in shapes:
            ev.bank(shape)
        ev.prepare([variant])
        assert ev.wait_for_warm(300)
        assert ev.warmed_ahead() == 1
        admitted = store.admitted
        assert admitted > 0 and store.offered == admitted
        result = ev.evaluate(variant, shapes)
        ev.wait_retired()
        assert result.status is Status.PASSED, result.feedback
        assert store.offered == admitted, (store.offered, admitted)


def test_a_seeds_triton_kernels_are_compiled_once_across_processes(tmp_path: Path) -> None:
    """The first process running triton_split compiles its kernels and the judge keeps
    them (triton_store.py); the next process running the same code finds every one in
    the store and compiles nothing itself (it offers the judge nothing)."""
    workload = load_workload("dsa_sparse_attention")
    seed = next(s for s in workload.seeds() if s.name == "triton_split")
    shapes = workload.subsets["smoke"]
    config = SandboxConfig(device="cuda", timeout_s=300, baseline="own")
    with SandboxEvaluator("dsa_sparse_attention", work_dir=tmp_path, config=config) as ev:
        store = ev.triton_store
        assert store is not None, ev.environment()["sandbox"]
        first = ev.evaluate(seed, shapes)
        ev.wait_retired()
        assert first.status is Status.PASSED, first.feedback
        assert store.admitted > 0 and store.offered == store.admitted
        offered = store.offered
        second = ev.evaluate(seed, shapes)
        ev.wait_retired()
        assert second.status is Status.PASSED, second.feedback
        assert store.offered == offered
