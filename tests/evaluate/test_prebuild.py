"""Compiles in confined processes: ahead of evaluation, or on demand; only the judge's
process writes the cache.

On this CPU machine the compiler is nvcc (the check a CPU evaluation does); on a GPU
machine it is NVRTC, through the same queue and cache.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from evokernel.candidate import Candidate, load_candidate
from evokernel.evaluate.build import check_cuda_nvcc, cuda_source, nvrtc_cubin
from evokernel.evaluate.build_cache import BuildCache
from evokernel.evaluate.isolation import probe
from evokernel.evaluate.prebuild import Prebuilder
from evokernel.evaluate.result import Evaluation, Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.runtime import LocalRuntime
from evokernel.testing import FakeEvaluator, fake_candidate
from evokernel.workload import workloads_root

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
SEEDS = workloads_root() / "dsa_topk" / "seeds"
SMOKE = ["30cecff1-7ea4-474b-90fc-7f4a87206d8e"]


@pytest.fixture(scope="module")
def cuda_seed() -> Candidate:
    return load_candidate(SEEDS / "cuda_radix.yaml", "dsa_topk")


def prebuilder(cache: Path, workers: int = 1, timeout_s: float = 300) -> Prebuilder:
    return Prebuilder(cache, compiler="nvcc", arch="sm_90a", workers=workers,
                      isolation=probe(), timeout_s=timeout_s)


def test_a_submitted_candidate_is_compiled_into_the_cache(tmp_path: Path, cuda_seed: Candidate) -> None:
    builder = prebuilder(tmp_path)
    try:
        assert builder.submit([cuda_seed, cuda_seed]) == 1  # each candidate once
        assert builder.idle(300)
        assert builder.wait(cuda_seed.id, 300) == "done"
    finally:
        builder.close()
    facts = check_cuda_nvcc(cuda_source(cuda_seed), "sm_90a", BuildCache(tmp_path))
    assert facts["build_cached"] == 1.0 and facts["registers"] > 0


def _has_nvrtc() -> bool:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _has_nvrtc(), reason="CuPy's NVRTC is not installed")
def test_nvrtc_builds_ahead_the_cubin_the_worker_loads(tmp_path: Path, cuda_seed: Candidate) -> None:
    """The GPU machine's path: NVRTC needs no device to compile, only the target arch."""
    builder = Prebuilder(tmp_path, compiler="nvrtc", arch="sm_90a", workers=1,
                         isolation=probe(), timeout_s=300)
    try:
        builder.submit([cuda_seed])
        assert builder.idle(300)
    finally:
        builder.close()
    cached, facts = nvrtc_cubin(cuda_source(cuda_seed), "sm_90a", BuildCache(tmp_path))
    fresh, _ = nvrtc_cubin(cuda_source(cuda_seed), "sm_90a")
    assert facts["build_cached"] == 1.0
    assert cached[:4] == b"\x7fELF" and len(cached) == len(fresh)


def test_only_cuda_candidates_are_queued(tmp_path: Path) -> None:
    builder = prebuilder(tmp_path)
    try:
        torch_seed = load_candidate(SEEDS / "torch_vectorized.yaml", "dsa_topk")
        assert builder.submit([torch_seed]) == 0
        assert builder.wait(torch_seed.id, 1) == "none"
    finally:
        builder.close()


def test_a_compile_not_started_yet_is_dropped_not_waited_for(tmp_path: Path, cuda_seed: Candidate) -> None:
    builder = prebuilder(tmp_path, workers=0)  # nobody serves the queue
    try:
        builder.submit([cuda_seed])
        assert builder.wait(cuda_seed.id, 300) == "dropped"
    finally:
        builder.close()
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_a_compile_past_its_time_limit_is_killed_and_costs_nothing(tmp_path: Path, cuda_seed: Candidate) -> None:
    builder = prebuilder(tmp_path, timeout_s=0.05)
    try:
        builder.submit([cuda_seed])
        assert builder.idle(60)
        assert builder.wait(cuda_seed.id, 60) == "done"
    finally:
        builder.close()
    assert not tmp_path.exists() or not list(tmp_path.glob("*.bin"))


def test_a_source_that_does_not_build_leaves_the_verdict_to_the_worker(tmp_path: Path, cuda_seed: Candidate) -> None:
    broken = cuda_seed.model_copy(update={"sources": {**cuda_seed.sources, "cuda_radix.cu": "this is not CUDA"}})
    config = SandboxConfig(device="cpu", timeout_s=120, prebuild_workers=1)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.prepare([broken])
        assert ev.wait_for_builds(300)
        evaluation = ev.evaluate(broken, SMOKE)
    assert evaluation.status is Status.BUILD_FAILED and "error" in evaluation.feedback


def test_sandbox_uses_the_build_done_ahead(tmp_path: Path, cuda_seed: Candidate) -> None:
    config = SandboxConfig(device="cpu", timeout_s=120, prebuild_workers=1)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.prepare([cuda_seed])
        assert ev.wait_for_builds(300)
        ahead = ev.evaluate(cuda_seed, SMOKE)
    assert ahead.status is Status.SKIPPED  # built, and running it needs a GPU
    assert ahead.resources["build_cached"] == 1.0 and ahead.resources["registers"] > 0


def test_without_building_ahead_the_worker_compiles(tmp_path: Path, cuda_seed: Candidate) -> None:
    config = SandboxConfig(device="cpu", timeout_s=120)  # CPU default: no build-ahead
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.prepare([cuda_seed])  # a no-op here
        first = ev.evaluate(cuda_seed, SMOKE)
        second = ev.evaluate(cuda_seed, SMOKE)  # the same variant again: from the cache
    assert first.resources["build_cached"] == 0.0 and first.resources["build_s"] > 0
    assert second.resources["build_cached"] == 1.0


def test_a_compile_on_demand_reports_the_compiler_log(tmp_path: Path, cuda_seed: Candidate) -> None:
    broken = cuda_seed.model_copy(update={"sources": {**cuda_seed.sources, "cuda_radix.cu": "not CUDA"}})
    builder = prebuilder(tmp_path, workers=0)
    try:
        built = builder.build(broken)
        good = builder.build(cuda_seed)
        again = builder.build(cuda_seed)
    finally:
        builder.close()
    assert built.binary is None and "error" in built.error
    assert good.binary and not good.cached and again.cached and again.binary == good.binary
    assert good.meta["resources"]["registers"] > 0


def test_without_a_compiler_a_cuda_candidate_is_skipped_not_failed(
        tmp_path: Path, cuda_seed: Candidate, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh machine with no CUDA toolkit says nothing about the kernel: SKIPPED."""
    monkeypatch.setattr("evokernel.evaluate.prebuild.shutil.which", lambda name: None)
    config = SandboxConfig(device="cpu", timeout_s=120)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        result = ev.evaluate(cuda_seed, SMOKE)
    assert result.status is Status.SKIPPED and "nvcc is not on PATH" in result.feedback


class _Recording(FakeEvaluator):
    def __init__(self) -> None:
        super().__init__()
        self.prepared: list[list[str]] = []

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        self.prepared.append([c.id for c in candidates])

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        assert self.prepared, "prepare comes before the first evaluation"
        return super().evaluate(candidate, shapes)


def test_local_runtime_hands_the_batch_over_before_evaluating() -> None:
    rt = LocalRuntime(_Recording)
    cands = [fake_candidate(TILE=t) for t in (32, 64)]
    assert len(dict(rt.evaluate(cands, ["s0"]))) == 2
    assert rt.evaluator.prepared == [[c.id for c in cands]]  # type: ignore[attr-defined]
