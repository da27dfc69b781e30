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

from .test_triton_store import FULLY_CONFINED, KEY, leaves_an_entry

triton_jit = pytest.importorskip("triton.runtime.jit")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Every Triton launch, as (kernel, warmup), in place of Triton's own ``run`` (this
    machine has no driver to compile for); and a device of 132 SMs to ask."""
    seen: list[tuple[str, bool]] = []

    def recorded(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        seen.append((str(getattr(self, "__name__", self)), warmup))

    monkeypatch.setattr(triton_jit.JITFunction, "run", recorded)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=132))
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
        assert torch.cuda.get_device_properties(torch.device("meta")).multi_processor_count == 132
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
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=132))
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
    """End to end on the CPU: ``prepare`` hands a trusted candidate to a warming process of
    its own, which loads it and calls it on meta tensors; the judge copies the entry it
    left in its private Triton cache into the store before killing it. No evaluation ran."""
    from evokernel.candidate import load_candidate
    from evokernel.evaluate.sandbox import SandboxEvaluator

    from .redteam import config_for

    path = tmp_path / "compiles.py"
    path.write_text(leaves_an_entry(KEY))
    trusted: Candidate = load_candidate(path, "dsa_topk")
    monkeypatch.setattr(TritonStore, "trusts", lambda self, c: c.id == trusted.id)
    monkeypatch.setattr(SandboxEvaluator, "_warms", lambda self, c: c.id == trusted.id)
    shape = "30cecff1-7ea4-474b-90fc-7f4a87206d8e"
    config = config_for("cpu", triton_warm_workers=1)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "work", config=config) as ev:
        assert ev.triton_store is not None
        assert "warmed ahead" in ev.environment()["sandbox"]
        ev.bank(shape)
        ev.prepare([trusted])
        assert ev.wait_for_warm(120)
        assert sorted(p.name for p in ev.triton_store.kernels.iterdir()) == [KEY]
        assert ev.triton_store.admitted == 1
        # the row solver reads values back, so its call failed on meta tensors: what its
        # build left is kept all the same, and the warm counts as none
        assert ev.warmed_ahead() == 0
        # the candidate's own evaluation then waits for nothing: its warm is done
        assert ev._warmer is not None and ev._warmer.wait(trusted.id, 0.0) == "done"


def test_no_warming_without_the_store_or_on_the_cpu_by_default(tmp_path: Path) -> None:
    from evokernel.evaluate.sandbox import SandboxEvaluator

    from .redteam import config_for

    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "a", config=config_for("cpu")) as ev:
        assert ev.warm_workers() == 0
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "b",
                          config=config_for("cpu", triton_store=False, triton_warm_workers=2)) as ev:
        assert ev.warm_workers() == 0 and "warmed ahead" not in ev.environment()["sandbox"]
