"""Triton kernels warmed ahead (triton_warm.py): launches only compiled, the seeds' host
code on meta tensors, and the judge keeping what a warming process compiled."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

from evokernel.candidate import Candidate
from evokernel.evaluate.build import build_runner
from evokernel.evaluate.triton_store import TritonStore
from evokernel.evaluate.triton_warm import compile_only, meta_arguments, warm_shapes
from evokernel.workload import load_workload

from .test_triton_store import FULLY_CONFINED, KEY, OTHER, leaves_an_entry

triton_jit = pytest.importorskip("triton.runtime.jit")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Every Triton launch, as (kernel, warmup), in place of Triton's own ``run`` (this
    machine has no driver to compile for)."""
    seen: list[tuple[str, bool]] = []

    def recorded(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        seen.append((str(getattr(self, "__name__", self)), warmup))

    monkeypatch.setattr(triton_jit.JITFunction, "run", recorded)
    return seen


def layout(workload_name: str, shape: str, scalars: dict[str, tuple[int, ...]] | None = None) -> list[list[Any]]:
    """One slot's argument specs as the judge sends them: inputs, then outputs."""
    workload = load_workload(workload_name)
    axes = workload.axes_of(shape)
    specs = []
    for name, spec in [*workload.definition.inputs.items(), *workload.definition.outputs.items()]:
        dims = (scalars or {}).get(name, ()) if spec.shape is None else tuple(axes[a] for a in spec.shape)
        specs.append([0, 0, list(dims), spec.dtype])
    return specs


def seed_runner(workload_name: str, seed_name: str, tmp_path: Path) -> Any:
    workload = load_workload(workload_name)
    seed = next(s for s in workload.seeds() if s.name == seed_name)
    runner, _ = build_runner(seed, tmp_path, arch="sm_90a",
                             arguments=[*workload.input_names, *workload.output_names])
    return runner


def test_a_launch_only_compiles_inside_and_launches_again_after(launches: list[tuple[str, bool]]) -> None:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def add_one(x_ptr: Any, n: Any, BLOCK: tl.constexpr) -> None:
        offsets = tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1, mask=offsets < n)

    x = torch.empty(8, device="meta")
    with compile_only() as asked:
        add_one[(1,)](x, 8, BLOCK=8)
    add_one[(1,)](x, 8, BLOCK=8)
    assert launches == [("add_one", True), ("add_one", False)]
    assert asked == ["add_one"]


def test_meta_arguments_follow_the_judges_layout() -> None:
    made = meta_arguments([[3, 128, [2, 16, 512], "bfloat16"], [3, 0, [], "float32"]])
    assert [(t.shape, t.dtype, t.device.type) for t in made] == [
        (torch.Size([2, 16, 512]), torch.bfloat16, "meta"), (torch.Size([]), torch.float32, "meta")]


@pytest.mark.parametrize(("workload_name", "seed_name", "scalars"), [
    ("dsa_sparse_attention", "triton_split", {"sm_scale": (1,)}),
    ("fused_moe", "triton_fused", None),
    ("dsa_topk", "triton_score", None),
])
def test_every_triton_seed_warms_on_meta_tensors(
        workload_name: str, seed_name: str, scalars: dict[str, tuple[int, ...]] | None,
        launches: list[tuple[str, bool]], tmp_path: Path) -> None:
    """Each shipped Triton seed's host code runs through on meta tensors of every smoke
    shape, asking for its kernels as compiles only, never a launch."""
    workload = load_workload(workload_name)
    shapes = {s: layout(workload_name, s, scalars) for s in workload.subsets["smoke"]}
    reply = warm_shapes(seed_runner(workload_name, seed_name, tmp_path), shapes)
    assert reply["failed"] == {}
    assert sorted(reply["warmed"]) == sorted(shapes)
    assert reply["kernels"] == len(launches) > 0
    assert all(warmup for _, warmup in launches), launches


class CompileOnlyDriver:
    """Triton's active driver as a GPU machine's would answer for an sm_90 device, with
    nothing to launch on: enough for ``JITFunction.run`` to compile (``warmup``)."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


def entries(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if any(f.suffix == ".cubin" for f in p.iterdir())}


@pytest.mark.parametrize(("workload_name", "seed_name", "scalars"), [
    ("dsa_sparse_attention", "triton_split", {"sm_scale": (1,)}),
    ("fused_moe", "triton_fused", None),
])
def test_triton_compiles_a_seeds_kernels_from_meta_tensors_as_from_real_ones(
        workload_name: str, seed_name: str, scalars: dict[str, tuple[int, ...]] | None,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's own JIT (not a recorder), driven as on an sm_90 GPU: the warm on meta tensors
    leaves whole cache entries with cubins, and the same call on real tensors then finds
    every kernel it asks for among them (the same specialisations: aligned pointers, the
    shape's integers), compiling nothing more and launching nothing."""
    from triton.runtime.driver import driver

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.setattr(driver, "_active", CompileOnlyDriver())
    workload = load_workload(workload_name)
    shape = workload.subsets["smoke"][0]
    specs = layout(workload_name, shape, scalars)
    reply = warm_shapes(seed_runner(workload_name, seed_name, tmp_path / "a"), {shape: specs})
    assert reply["warmed"] == [shape] and reply["kernels"] > 0
    warmed = entries(cache)
    assert len(warmed) == reply["kernels"]
    # a fresh import (no kernel in memory) on real tensors of the same layout
    real = [torch.empty(t.shape, dtype=t.dtype) for t in meta_arguments(specs)]
    with compile_only() as asked:
        seed_runner(workload_name, seed_name, tmp_path / "b")(*real)
    assert len(asked) == reply["kernels"]
    assert entries(cache) == warmed


def test_a_shape_the_host_code_cannot_run_on_meta_is_reported_not_raised(
        launches: list[tuple[str, bool]]) -> None:
    def reads_back(x: torch.Tensor) -> None:
        if x.sum().item() > 0:  # a value read back: meta tensors have none
            raise AssertionError("unreachable")

    reply = warm_shapes(reads_back, {"a": [[0, 0, [4], "float32"]]})
    assert reply["warmed"] == [] and list(reply["failed"]) == ["a"]
    assert "meta" in reply["failed"]["a"] or "item" in reply["failed"]["a"].lower()


@pytest.mark.skipif(not FULLY_CONFINED, reason="needs root and permission to create namespaces")
def test_the_judge_keeps_what_a_warming_process_compiled_before_any_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on the CPU: ``prepare`` hands two trusted candidates to the one warming
    process, which loads each and calls it on meta tensors; the judge copies the entry each
    left in the process's private Triton cache into the store. No evaluation ran, and one
    process served both."""
    from evokernel.candidate import load_candidate
    from evokernel.evaluate.sandbox import SandboxEvaluator

    from .redteam import config_for

    def candidate(key: str) -> Candidate:
        path = tmp_path / f"compiles_{key[0].lower()}.py"
        path.write_text(leaves_an_entry(key))
        return load_candidate(path, "dsa_topk")

    trusted = [candidate(KEY), candidate(OTHER)]
    ids = {c.id for c in trusted}
    monkeypatch.setattr(TritonStore, "trusts", lambda self, c: c.id in ids)
    monkeypatch.setattr(SandboxEvaluator, "_warms", lambda self, c: c.id in ids)
    shape = "30cecff1-7ea4-474b-90fc-7f4a87206d8e"
    config = config_for("cpu", triton_warm_workers=1)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "work", config=config) as ev:
        assert ev.triton_store is not None
        assert "warmed ahead" in ev.environment()["sandbox"]
        ev.bank(shape)
        ev.prepare(trusted)
        assert ev.wait_for_warm(120)
        assert sorted(p.name for p in ev.triton_store.kernels.iterdir()) == sorted([KEY, OTHER])
        assert ev.triton_store.admitted == 2
        # the process forgot the first's entry once it was kept: it was not offered twice
        assert ev.triton_store.offered == 2
        # the row solver reads values back, so its calls failed on meta tensors: what its
        # builds left is kept all the same, and the warms count as none
        assert ev.warmed_ahead() == 0
        assert sorted(p.name for p in (tmp_path / "work" / "logs").glob("warm-*.log")) == ["warm-00001.log"]
        # the candidates' own evaluations then wait for nothing: their warms are done
        assert ev._warmer is not None and ev._warmer.wait(trusted[0].id, 0.0) == "done"


def test_no_warming_without_the_store_or_on_the_cpu_by_default(tmp_path: Path) -> None:
    from evokernel.evaluate.sandbox import SandboxEvaluator

    from .redteam import config_for

    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "a", config=config_for("cpu")) as ev:
        assert ev.warm_workers() == 0
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "b",
                          config=config_for("cpu", triton_store=False, triton_warm_workers=2)) as ev:
        assert ev.warm_workers() == 0 and "warmed ahead" not in ev.environment()["sandbox"]


class FakeProcess:
    """A warming process as the warmer sees one: ``ready`` waits for ``go``; each request
    is recorded and answered from ``replies`` (an exception is raised)."""

    def __init__(self, go: Any, replies: dict[str, Any]) -> None:
        self.go, self.replies = go, replies
        self.requests: list[str] = []
        self.killed = False

    def ready(self) -> None:
        assert self.go.wait(10)

    def alive(self) -> bool:
        return not self.killed

    def kill(self) -> bool:
        self.killed = True
        return True

    def request(self, op: str, timeout_s: float | None, **fields: Any) -> dict[str, Any]:
        self.requests.append(op)
        reply = self.replies.get(op, {})
        if isinstance(reply, Exception):
            raise reply
        return dict(reply)


def warmer_with(replies: dict[str, Any], go: Any = None) -> tuple[Any, list[FakeProcess], list[int]]:
    """A one-worker warmer over fake processes; ``go``: an event their start waits for
    (none: they start at once)."""
    import threading

    from evokernel.evaluate import triton_warm

    if go is None:
        go = threading.Event()
        go.set()
    started: list[FakeProcess] = []
    admitted: list[int] = []

    def start(tag: str) -> Any:
        started.append(FakeProcess(go, replies))
        return started[-1]

    warmer = triton_warm.TritonWarmer(start, lambda h, e: None, lambda c: {},
                                      lambda h: admitted.append(1), workers=1, timeout_s=5)
    return warmer, started, admitted


def fake_candidates(count: int) -> list[Any]:
    return [types.SimpleNamespace(id=f"{i:016x}") for i in range(count)]


def test_one_warming_process_serves_candidate_after_candidate() -> None:
    warmer, started, admitted = warmer_with({"warm": {"warmed": ["s"], "kernels": 2, "failed": {}}})
    warmer.submit(fake_candidates(3), {"s": [[0, 0, [4], "float32"]]})
    assert warmer.idle(10)
    assert len(started) == 1
    assert started[0].requests == ["load", "warm"] + ["forget", "load", "warm"] * 2
    assert len(admitted) == 3 and warmer.warmed == 3
    warmer.close()
    assert started[0].killed


def test_a_warming_process_that_fails_is_replaced_and_one_used_long_is_recycled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from evokernel.evaluate import triton_warm
    from evokernel.evaluate.channel import ChannelTimeout

    monkeypatch.setattr(triton_warm, "RECYCLE_AFTER", 2)
    warmer, started, admitted = warmer_with({"warm": ChannelTimeout("no reply")})
    warmer.submit(fake_candidates(1), {"s": [[0, 0, [4], "float32"]]})
    assert warmer.idle(10)
    assert started[0].killed and admitted == [] and warmer.wait(fake_candidates(1)[0].id, 0) == "done"
    started[0].replies.clear()  # every process answers now (they share the replies)
    warmer.submit(fake_candidates(4)[1:], {"s": [[0, 0, [4], "float32"]]})
    assert warmer.idle(10)
    assert len(started) == 3, "one replacing the failed process, one after two loads"
    assert [p.requests.count("load") for p in started] == [1, 2, 1]
    warmer.close()


def wait_for_a_start(started: list[FakeProcess]) -> None:
    import time

    deadline = time.monotonic() + 5
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started


def test_the_judge_can_wait_for_a_warming_process_to_start() -> None:
    import threading

    go = threading.Event()
    warmer, started, _ = warmer_with({}, go)
    warmer.submit(fake_candidates(1), {"s": [[0, 0, [4], "float32"]]})
    wait_for_a_start(started)
    assert warmer.await_started(timeout_s=0.2) >= 0.2, "still starting: the wait ran out"
    threading.Timer(0.3, go.set).start()
    waited = warmer.await_started(timeout_s=5)
    assert 0.1 < waited < 5
    assert warmer.idle(5)
    warmer.close()


def test_a_queued_warm_is_dropped_when_its_candidate_comes_first() -> None:
    import threading

    go = threading.Event()
    warmer, started, _ = warmer_with({}, go)
    first, second = fake_candidates(2)
    warmer.submit([first, second], {"s": [[0, 0, [4], "float32"]]})
    wait_for_a_start(started)  # the first is warming, the second still queued
    assert warmer.wait(second.id, 0) == "dropped"
    go.set()
    assert warmer.wait(first.id, 5) == "done"
    assert warmer.idle(5) and started[0].requests == ["load", "warm"]
    assert warmer.wait("unknown", 0) == "none"
    warmer.close()


def test_triton_split_reads_meta_tensors_as_the_current_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm sizes triton_split's grid for the GPU it runs on (here one of 114 SMs), not
    for the interpreter's assumed 132: else it would compile kernels no call asks for."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "workloads/dsa_sparse_attention/seeds/triton_split.py"
    spec = importlib.util.spec_from_file_location("triton_split_for_warm_test", path)
    assert spec is not None and spec.loader is not None
    seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    assert seed.wave_size(torch.device("meta"), 1) == seed.INTERPRETER_SMS  # no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=114))
    assert seed.wave_size(torch.device("meta"), 2) == 228


@pytest.mark.skipif(not FULLY_CONFINED, reason="needs root and permission to create namespaces")
def test_an_untrusted_candidate_is_never_warmed_and_leaves_nothing_in_the_store(tmp_path: Path) -> None:
    """The attack from inside build and run: a candidate not of a seed's code leaves a
    cache entry at build and tries to write the store. ``prepare`` hands it to no warming
    process, its evaluation passes, and the store stays empty."""
    from evokernel.candidate import load_candidate
    from evokernel.evaluate.result import Status
    from evokernel.evaluate.sandbox import SandboxEvaluator

    from .redteam import config_for

    path = tmp_path / "compiles.py"
    path.write_text(leaves_an_entry(KEY))
    attacker = load_candidate(path, "dsa_topk")
    shape = "30cecff1-7ea4-474b-90fc-7f4a87206d8e"
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "work",
                          config=config_for("cpu", triton_warm_workers=1)) as ev:
        assert ev.triton_store is not None and not ev._warms(attacker)
        ev.bank(shape)
        ev.prepare([attacker])
        assert ev._warmer is None, "no warming process was started for it"
        result = ev.evaluate(attacker, [shape])
        ev.wait_retired()
        assert result.status is Status.PASSED, result.feedback
        assert list(ev.triton_store.kernels.iterdir()) == [] and ev.triton_store.admitted == 0
