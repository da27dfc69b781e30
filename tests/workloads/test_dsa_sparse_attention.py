"""The dsa_sparse_attention workload: definition, shapes, inputs, reference, checker.

Cross-checks against the published FlashInfer-Trace files run where a copy of the
dataset is found: $EVOKERNEL_TRACE_ROOT, or shared/flashinfer-trace one or two levels
above the repository (a worktree sits one level deeper than the main checkout).
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest
import torch

from evokernel.candidate import Candidate, load_candidate
from evokernel.evaluate.build import build_runner, cuda_source, kernel_names, nvrtc_cubin
from evokernel.evaluate.check import Verdict, check_outputs
from evokernel.workload import Definition, Workload, load_workload

DEF = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
REPO = Path(__file__).resolve().parents[2]
SMALL = {"num_tokens": 3, "num_pages": 200}
"""Small enough for the published reference on the CPU; rows of 2048 and padded rows."""


def trace_root() -> Path:
    env = os.environ.get("EVOKERNEL_TRACE_ROOT")
    places = [Path(env)] if env else []
    places += [REPO.parent / "shared" / "flashinfer-trace",
               REPO.parent.parent / "shared" / "flashinfer-trace"]
    for place in places:
        if (place / "definitions").is_dir():
            return place
    pytest.skip(f"no FlashInfer-Trace copy at {[str(p) for p in places]}: "
                "the cross-check against published files is skipped")


@pytest.fixture(scope="module")
def wl() -> Workload:
    return load_workload("dsa_sparse_attention")


@pytest.fixture(scope="module")
def published() -> dict:  # type: ignore[type-arg]
    path = next((trace_root() / "definitions").rglob(f"{DEF}.json"), None)
    if path is None:
        pytest.skip(f"{DEF}.json is not in the FlashInfer-Trace copy")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def published_run(published: dict) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:  # type: ignore[type-arg]
    namespace: dict[str, object] = {}
    exec(compile(published["reference"], "published_reference", "exec"), namespace)
    return namespace["run"]  # type: ignore[return-value]


def small_inputs(wl: Workload, seed: int, **axes: int) -> dict[str, torch.Tensor]:
    all_axes = {**wl.definition.const_axes(), **SMALL, **axes}
    return wl._inputs_module.make_inputs(all_axes, seed, "cpu")  # type: ignore[no-any-return]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


# -- definition and shapes ---------------------------------------------------------------


def test_definition_matches_published(wl: Workload, published: dict) -> None:  # type: ignore[type-arg]
    theirs = Definition.model_validate(published)
    ours = wl.definition
    assert ours.name == theirs.name == DEF and ours.op_type == theirs.op_type
    assert ours.reference is None, "we do not ship the published reference"
    assert {k: (a.type, a.value) for k, a in ours.axes.items()} == {
        k: (a.type, a.value) for k, a in theirs.axes.items()
    }
    assert ours.constraints == theirs.constraints
    for mine, other in ((ours.inputs, theirs.inputs), (ours.outputs, theirs.outputs)):
        assert list(mine) == list(other), "same names in the same (signature) order"
        assert [(s.shape, s.dtype) for s in mine.values()] == [
            (s.shape, s.dtype) for s in other.values()
        ]
        for name, spec in mine.items():
            assert spec.description and spec.description != other[name].description


def test_shapes_match_published(wl: Workload) -> None:
    path = trace_root() / "workloads" / f"{DEF}.shapes.csv"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    rows = {r["uuid"]: r for r in csv.DictReader(path.open())}
    assert len(wl.shapes) == 23 and set(rows) == set(wl.shapes)
    for uuid, shape in wl.shapes.items():
        assert shape.axes == {k: int(rows[uuid][k]) for k in ("num_tokens", "num_pages")}


def test_subsets(wl: Workload) -> None:
    quick, heldout, smoke = (wl.subsets[n] for n in ("quick", "heldout", "smoke"))
    assert not set(quick) & set(heldout), "heldout is never seen by selection"
    assert len(smoke) == 3
    sizes = {wl.shapes[s].axes["num_tokens"] for s in wl.shapes}
    assert {wl.shapes[s].axes["num_tokens"] for s in quick} == sizes == {1, 2, 6, 7, 8}
    assert {wl.shapes[s].axes["num_tokens"] for s in smoke} == {1, 2, 8}


# -- inputs ---------------------------------------------------------------------------


def test_make_inputs_is_deterministic(wl: Workload) -> None:
    a, b, c = small_inputs(wl, 5), small_inputs(wl, 5), small_inputs(wl, 6)
    assert list(a) == wl.input_names
    assert all(torch.equal(_bits(a[k]), _bits(b[k])) for k in a)
    for name in ("q_nope", "ckv_cache", "kpe_cache", "sparse_indices"):
        assert not torch.equal(_bits(a[name]), _bits(c[name])), name


def test_index_rows_look_like_an_indexers(wl: Workload) -> None:
    inputs = small_inputs(wl, 0, num_tokens=6, num_pages=600)
    rows = inputs["sparse_indices"].long()
    valid = rows >= 0
    counts = valid.sum(dim=1)
    assert int(counts[0]) == 2048, "token 0 always has a full row"
    assert bool((counts >= 1).all())
    # padding only at the end of a row, and only -1
    assert bool((rows[~valid] == -1).all())
    assert torch.equal(valid, torch.arange(2048)[None, :] < counts[:, None])
    pages = [set((row[row >= 0] // 64).tolist()) for row in rows]
    for t, row in enumerate(rows):
        ids = row[row >= 0]
        assert ids.unique().numel() == ids.numel(), "no token twice in a row"
        assert int(ids.max()) < 600 * 64
        assert not any(pages[t] & pages[u] for u in range(t)), "requests own their pages"
    assert bool((counts < 2048).any()) and not bool((rows[:, :-1] < rows[:, 1:]).all()), (
        "some rows are padded, and ids come in no particular order"
    )


def test_real_shape_inputs(wl: Workload) -> None:
    shape = wl.subsets["smoke"][-1]
    inputs = wl.make_inputs(shape, 0)
    axes = wl.axes_of(shape)
    t, pages = axes["num_tokens"], axes["num_pages"]
    assert tuple(inputs["ckv_cache"].shape) == (pages, 64, 512)
    assert tuple(inputs["kpe_cache"].shape) == (pages, 64, 64)
    assert tuple(inputs["q_nope"].shape) == (t, 16, 512) and tuple(inputs["q_pe"].shape) == (t, 16, 64)
    assert tuple(inputs["sparse_indices"].shape) == (t, 2048)
    assert all(inputs[n].dtype == torch.bfloat16 for n in ("q_nope", "q_pe", "ckv_cache", "kpe_cache"))
    assert inputs["sparse_indices"].dtype == torch.int32
    assert inputs["sm_scale"].dtype == torch.float32
    assert float(inputs["sm_scale"]) == pytest.approx(1 / math.sqrt(192))
    assert float(inputs["ckv_cache"][-1].float().std()) > 0.5, "no page is left empty"
    output, lse = wl.allocate_outputs(shape, "cpu")
    assert tuple(output.shape) == (t, 16, 512) and output.dtype == torch.bfloat16
    assert tuple(lse.shape) == (t, 16) and lse.dtype == torch.float32


def test_vary_inputs_changes_the_answer(wl: Workload) -> None:
    axes = {**wl.definition.const_axes(), **SMALL}
    inputs = small_inputs(wl, 1)
    vary = wl._inputs_module.vary_inputs
    variant = vary(inputs, axes, 7, "cpu")
    assert set(variant) == {"q_nope", "q_pe", "sparse_indices"}
    for name, tensor in variant.items():
        assert tensor.shape == inputs[name].shape and tensor.dtype == inputs[name].dtype
        assert not torch.equal(_bits(tensor), _bits(inputs[name])), name
    again = vary(inputs, axes, 7, "cpu")
    assert all(torch.equal(_bits(variant[k]), _bits(again[k])) for k in variant)
    assert not torch.equal(vary(inputs, axes, 8, "cpu")["q_nope"], variant["q_nope"])
    assert int(variant["sparse_indices"].max()) < SMALL["num_pages"] * 64
    before = wl.reference(*inputs.values())
    after = wl.reference(*{**inputs, **variant}.values())
    assert not check_outputs(wl, after, before, inputs).ok


def test_cost_counts_each_gathered_row_once(wl: Workload) -> None:
    inputs = small_inputs(wl, 0)
    rows = inputs["sparse_indices"]
    valid = int((rows >= 0).sum())
    fixed = 3 * 16 * 576 * 2 + 3 * 16 * (1024 + 4) + rows.numel() * 4
    cost = wl.cost(inputs)
    assert cost is not None
    assert cost["bytes"] == valid * 1152 + fixed, "rows are distinct across requests"
    assert cost["flops"] == 2 * 16 * (576 + 512) * valid
    shared = dict(inputs, sparse_indices=rows.clone())
    shared["sparse_indices"][1] = rows[0]
    assert wl.cost(shared)["bytes"] == (valid - int((rows[1] >= 0).sum())) * 1152 + fixed  # type: ignore[index]
    empty = dict(inputs, sparse_indices=torch.full_like(rows, -1))
    assert wl.cost(empty) == {"bytes": float(fixed), "flops": 0.0}, "no valid index: no cache bytes, no flops"


# -- reference and checker ----------------------------------------------------------------


def _with_edge_rows(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Row 1 has no valid index; row 2 has -1 slots scattered through it."""
    rows = inputs["sparse_indices"].clone()
    rows[1] = -1
    rows[2, ::3] = -1
    return {**inputs, "sparse_indices": rows}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_matches_published(wl: Workload, published_run: Callable, seed: int) -> None:  # type: ignore[type-arg]
    inputs = small_inputs(wl, seed, num_pages=200 + 100 * seed)
    if seed == 2:
        inputs = _with_edge_rows(inputs)
    ours = wl.reference(*inputs.values())
    theirs = published_run(*inputs.values())
    assert check_outputs(wl, ours, theirs, inputs).ok and check_outputs(wl, theirs, ours, inputs).ok
    assert (ours[0].float() - theirs[0].float()).abs().max() <= 2 ** -7
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-5)
    if seed == 2:
        assert bool((ours[0][1] == 0).all()) and bool(torch.isneginf(ours[1][1]).all())


Outputs = tuple[torch.Tensor, torch.Tensor]


def _reference_on(wl: Workload, inputs: dict[str, torch.Tensor], **changes: torch.Tensor) -> Outputs:
    return wl.reference(*{**inputs, **changes}.values())  # type: ignore[return-value]


def _one_nan(ref: Outputs) -> Outputs:
    output = ref[0].clone()
    output[-1, 3, 100] = float("nan")
    return output, ref[1]


def _one_inf(ref: Outputs) -> Outputs:
    lse = ref[1].clone()
    lse[0, 5] = float("inf")
    return ref[0], lse


def _last_token_zero(ref: Outputs) -> Outputs:
    output, lse = ref[0].clone(), ref[1].clone()
    output[-1], lse[-1] = 0, 0
    return output, lse


Wrong = Callable[[Workload, dict[str, torch.Tensor], Outputs], Outputs]
WRONG: dict[str, Wrong] = {
    "ignores the rotary part": lambda wl, i, ref: _reference_on(
        wl, i, q_pe=torch.zeros_like(i["q_pe"])),
    "reads -1 as token 0": lambda wl, i, ref: _reference_on(
        wl, i, sparse_indices=i["sparse_indices"].clamp(min=0)),
    "unscaled logits": lambda wl, i, ref: _reference_on(
        wl, i, sm_scale=torch.ones_like(i["sm_scale"])),
    "natural-log lse": lambda wl, i, ref: (ref[0], ref[1] * math.log(2.0)),
    "token 0 duplicated": lambda wl, i, ref: (
        ref[0][:1].expand_as(ref[0]).clone(), ref[1][:1].expand_as(ref[1]).clone()),
    "last token not written": lambda wl, i, ref: _last_token_zero(ref),
    "one NaN": lambda wl, i, ref: _one_nan(ref),
    "lse left as poison": lambda wl, i, ref: (ref[0], torch.full_like(ref[1], float("nan"))),
    "one inf": lambda wl, i, ref: _one_inf(ref),
    "finite lse for an empty row": lambda wl, i, ref: (ref[0], ref[1].nan_to_num(neginf=0.0)),
    "float32 output": lambda wl, i, ref: (ref[0].float(), ref[1]),
    "lse of one token too few": lambda wl, i, ref: (ref[0], ref[1][:-1]),
}


@pytest.mark.parametrize("what", list(WRONG))
def test_checker_rejects(wl: Workload, what: str) -> None:
    inputs = small_inputs(wl, 3)
    if what == "finite lse for an empty row":
        inputs = _with_edge_rows(inputs)
    assert bool((inputs["sparse_indices"] < 0).any())
    ref: Outputs = wl.reference(*inputs.values())  # type: ignore[assignment]
    assert check_outputs(wl, ref, ref, inputs).ok
    wrong = WRONG[what](wl, inputs, ref)
    verdict = check_outputs(wl, wrong, ref, inputs)
    assert not verdict.ok and verdict.message


def test_checker_applies_both_thresholds(wl: Workload) -> None:
    inputs = _with_edge_rows(small_inputs(wl, 4))
    output, lse = wl.reference(*inputs.values())
    assert bool(torch.isneginf(lse).any()) and float(lse[torch.isfinite(lse)].min()) > 5
    finite = torch.isfinite(lse)
    # lse of about 13: off by 0.9% (0.12 absolute) passes on rtol, by 1.2% fails both
    assert check_outputs(wl, (output, lse + 0.009 * lse.abs().where(finite, 0.0)), (output, lse), inputs).ok
    verdict = check_outputs(wl, (output, lse + 0.012 * lse.abs().where(finite, 0.0)), (output, lse), inputs)
    assert not verdict.ok and verdict.message.startswith("lse")
    # small outputs: off by 0.008 (far beyond 1%) passes on atol, by 0.02 fails both
    small = output.float().abs() < 0.25
    assert int(small.sum()) > 1000
    nudged = torch.where(small, output.float() + 0.008, output.float()).to(torch.bfloat16)
    assert check_outputs(wl, (nudged, lse), (output, lse), inputs).ok
    nudged = torch.where(small, output.float() + 0.02, output.float()).to(torch.bfloat16)
    verdict = check_outputs(wl, (nudged, lse), (output, lse), inputs)
    assert not verdict.ok and verdict.message.startswith("output")


def test_checker_works_on_the_device_of_its_tensors(wl: Workload) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    inputs = {k: v.cuda() for k, v in small_inputs(wl, 0).items()}
    ref = wl.reference(*inputs.values())
    assert check_outputs(wl, ref, ref, inputs).ok


# -- seeds ----------------------------------------------------------------------------

SEEDS = REPO / "workloads" / "dsa_sparse_attention" / "seeds"


def _seed(wl: Workload, manifest: str, **knobs: object) -> Candidate:
    candidate = load_candidate(SEEDS / manifest, wl.name)
    if knobs:
        candidate = candidate.with_params(knobs=knobs, operator="test")  # type: ignore[arg-type]
    return candidate


def import_seed_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"seed_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_checked(wl: Workload, fn: Callable[..., None], inputs: dict[str, torch.Tensor]) -> Verdict:
    """Call the DPS function on poisoned outputs and judge what it wrote."""
    expected = wl.reference(*inputs.values())
    outputs = [torch.full_like(e, float("nan")) for e in expected]
    fn(*inputs.values(), *outputs)
    return check_outputs(wl, outputs, expected, inputs)  # type: ignore[no-any-return]


def test_every_seed_loads(wl: Workload) -> None:
    names = {c.name: c.language.value for c in wl.seeds()}
    assert names == {"torch_gather": "torch", "triton_split": "triton", "cuda_mma": "cuda",
                     "cuda_resident": "cuda"}


@pytest.fixture(scope="module")
def smoke_sets(wl: Workload) -> dict[str, dict[str, torch.Tensor]]:
    """One input set per smoke shape (624 MB each), shared by the torch seed's tests."""
    return {shape: wl.make_inputs(shape, 11) for shape in wl.subsets["smoke"]}


@pytest.mark.parametrize("knobs", [
    {},
    {"QK": "concat", "SOFTMAX": "exp2"},
    {"QK": "split", "SOFTMAX": "exp2"},
    {"COMPILE": "inductor"},
])
def test_torch_seed_on_smoke_shapes(
    wl: Workload, tmp_path: Path, smoke_sets: dict[str, dict[str, torch.Tensor]], knobs: dict[str, str]
) -> None:
    candidate = _seed(wl, "torch_gather.yaml", **knobs)
    fn, _ = build_runner(candidate, tmp_path, arch=None,
                         arguments=[*wl.input_names, *wl.output_names])
    for shape, inputs in smoke_sets.items():
        verdict = _run_checked(wl, fn, inputs)
        assert verdict.ok, f"{shape}: {verdict.message}"


def test_torch_seed_on_empty_and_scattered_padding(wl: Workload, tmp_path: Path) -> None:
    for knobs in ({"SOFTMAX": "torch"}, {"SOFTMAX": "exp2"}):
        fn, _ = build_runner(_seed(wl, "torch_gather.yaml", **knobs), tmp_path, arch=None,
                             arguments=[*wl.input_names, *wl.output_names])
        verdict = _run_checked(wl, fn, _with_edge_rows(small_inputs(wl, 9)))
        assert verdict.ok, verdict.message


TRITON_CASES = [
    {"NUM_SPLITS": 4, "HEADS_PER_PROGRAM": 16, "BLOCK_N": 32},
    {"NUM_SPLITS": 4, "HEADS_PER_PROGRAM": 16, "BLOCK_N": 32, "COMBINE": "separate"},
    {"NUM_SPLITS": 1, "HEADS_PER_PROGRAM": 8, "BLOCK_N": 64},  # no combine step
    {"NUM_SPLITS": 64, "HEADS_PER_PROGRAM": 16, "BLOCK_N": 64},  # spans shorter than a step
    {"NUM_SPLITS": 64, "HEADS_PER_PROGRAM": 8, "BLOCK_N": 64, "COMBINE": "separate"},
    {"NUM_SPLITS": 0, "HEADS_PER_PROGRAM": 8, "BLOCK_N": 16},  # splits chosen from the shape
    {"NUM_SPLITS": 0, "HEADS_PER_PROGRAM": 16, "BLOCK_N": 16, "MAX_SPLITS": 64},
    {"NUM_SPLITS": 16, "BLOCK_N": 32, "PARTIALS": "bfloat16"},
    {"NUM_SPLITS": 8, "BLOCK_N": 64, "PARTIALS": "bfloat16", "COMBINE": "separate"},
    # spread: 32 splits of 64 slots for 3 tokens (SLICE 16), 64 of 32 for 2 (SLICE 8)
    {"COMBINE": "spread"},
    # 8-head groups, bf16 partials: 16 splits for 3 tokens, 32 for 2; NUM_SPLITS only caps
    {"COMBINE": "spread", "HEADS_PER_PROGRAM": 8, "NUM_SPLITS": 128, "PARTIALS": "bfloat16"},
    {"COMBINE": "spread", "NUM_SPLITS": 4, "BLOCK_N": 64},
    # token bands: the 3-token call takes the plain knobs, the 2-token one the FEW_ ones
    # (another head grouping and split count on the same workspace and counters)
    {"FEW_TOKENS": 2, "NUM_SPLITS": 8, "FEW_HEADS_PER_PROGRAM": 8, "FEW_BLOCK_N": 16, "FEW_NUM_SPLITS": 4},
    {"COMBINE": "spread", "FEW_TOKENS": 2, "FEW_HEADS_PER_PROGRAM": 8, "FEW_NUM_SPLITS": 16, "FEW_BLOCK_N": 64},
    {"FEW_TOKENS": 2, "PARTIALS": "bfloat16", "COMBINE": "spread"},  # the seed's defaults in both bands
]
"""Knob sets of the interpreter test; COMBINE is fused (the default) unless named, and
FEW_TOKENS 0 (every call takes the plain knobs) and PARTIALS float32 unless named. Under
the interpreter spread cannot spin (programs run one after another): its split kernel
only arrives, and a second launch runs the same slice merge (``spread_merge_kernel``);
the wait itself is checked in the PTX (test_triton_seed_compiles_for_sm90) and on a GPU."""

INTERPRETED_CHECK = """
import json, sys, torch
from pathlib import Path
from evokernel.candidate import load_candidate
from evokernel.evaluate.build import build_runner
from evokernel.evaluate.check import check_outputs
from evokernel.workload import load_workload
wl = load_workload("dsa_sparse_attention")
axes = {**wl.definition.const_axes(), "num_tokens": 3, "num_pages": 100}
inputs = wl._inputs_module.make_inputs(axes, 4, "cpu")
rows = inputs["sparse_indices"]
rows[1] = -1
rows[2, ::3] = -1
expected = wl.reference(*inputs.values())
# a second call on a new decode step with fewer tokens: the fused merge's workspace and
# counters (left at zero by the first call) serve it without a reset
varied = {**inputs, **wl._inputs_module.vary_inputs(inputs, axes, 5, "cpu")}
varied = {k: v[:2] if k in ("q_nope", "q_pe", "sparse_indices") else v for k, v in varied.items()}
varied["sparse_indices"][1, 100:] = -1
calls = [(inputs, expected), (varied, wl.reference(*varied.values()))]
seed = load_candidate(sys.argv[1], wl.name)
failed = 0
for knobs in json.loads(sys.argv[2]):
    knobs = {"FEW_TOKENS": 0, "PARTIALS": "float32", **knobs}
    fn, _ = build_runner(seed.with_params(knobs=knobs, operator="test"), Path(sys.argv[3]),
                         arch=None, arguments=[*wl.input_names, *wl.output_names])
    for call, (given, want) in enumerate(calls):
        outputs = [torch.full_like(e, float("nan")) for e in want]
        fn(*given.values(), *outputs)
        verdict = check_outputs(wl, outputs, want, given)
        ok = verdict.ok
        if not ok and knobs["PARTIALS"] == "bfloat16":
            # bf16 partials are rounded per split: the output may sit two bf16 steps off,
            # past the 1e-2 tolerance where a short row's output nears 1 (the judge's rows
            # hold 512 tokens or more, and their outputs stay far below 1)
            got, ref = outputs[0].float(), want[0].float()
            bound = torch.maximum(0.01 + 0.01 * ref.abs(), 2 * 2 ** -7 * ref.abs())
            ok = bool(((got - ref).abs() <= bound).all())
            ok = ok and check_outputs(wl, [want[0], outputs[1]], want, given).ok
        print(knobs, call, ok, verdict.message, flush=True)
        failed += not ok
sys.exit(1 if failed else 0)
"""


@pytest.mark.slow
def test_triton_seed_under_the_interpreter(tmp_path: Path) -> None:
    """Every code path of the Triton seed (fused, separate or spread merge, one split,
    short spans, 8-head groups, bf16 partials) on a token with a full row, one with no
    valid slot and one with scattered -1; then a second call on other inputs with fewer
    tokens (and, for spread, another split count on the same counters)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", INTERPRETED_CHECK, str(SEEDS / "triton_split.yaml"),
         json.dumps(TRITON_CASES), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" True ") == 2 * len(TRITON_CASES)


def _triton_split_ptx(module: ModuleType, warps: int = 4, partials: str = "*fp32",
                      **constants: object) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    pointers = {
        "q_nope_ptr": "*bf16", "q_pe_ptr": "*bf16", "ckv_ptr": "*bf16", "kpe_ptr": "*bf16",
        "idx_ptr": "*i32", "scale_ptr": "*fp32", "part_out_ptr": partials,
        "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "count_ptr": "*i32",
    }
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers))}
    source = ASTSource(module.split_kernel, {**pointers, **dict.fromkeys(constants, "constexpr")},
                       constexprs=constants, attrs=aligned)
    kernel = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    assert kernel.asm["cubin"] and "mma.sync" in kernel.asm["ptx"]
    assert ".target sm_90" in kernel.asm["ptx"]
    return kernel.asm["ptx"]  # type: ignore[no-any-return]


def test_triton_seed_compiles_for_sm90() -> None:
    """Ahead-of-time compile of both kernels for an H100/H200 without a GPU; the fused
    merge counts arrivals with one acq_rel atomic after a CTA barrier, and reads the
    partials from L2 (.cg)."""
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    module = import_seed_module(SEEDS / "triton_split.py")
    target = GPUTarget("cuda", 90, 32)
    for heads, block_n, stages, warps, fused in ((16, 32, 2, 4, True), (8, 64, 3, 8, False),
                                                 (8, 16, 1, 8, True)):
        constants = {"TOPK": 2048, "NUM_SPLITS": 16, "HEADS_PER_PROGRAM": heads,
                     "ROWS": 16, "BLOCK_N": block_n, "NUM_STAGES": stages, "DOT_F32": False,
                     "FUSED": fused, "SPLITS_POW2": 16}
        ptx = _triton_split_ptx(module, warps, **constants)
        atomics = [line for line in ptx.splitlines() if "atom." in line]
        if fused:
            add = next(i for i, line in enumerate(ptx.splitlines()) if "atom.global.gpu.acq_rel.add" in line)
            assert "bar.sync" in "\n".join(ptx.splitlines()[add - 12:add]), "barrier before the release"
            assert len(atomics) == 2 and "ld.global.cg.v4" in ptx
        else:
            assert not atomics
    combine = {"NUM_SPLITS": 16, "SPLITS_POW2": 16}
    source = ASTSource(
        module.combine_kernel,
        {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
         **dict.fromkeys(combine, "constexpr")},
        constexprs=combine,
    )
    assert compile(source, target=target, options={"num_warps": 4}).asm["cubin"]


@pytest.mark.parametrize(("splits", "heads", "partials"), [(128, 16, "*fp32"), (16, 16, "*bf16"),
                                                           (64, 8, "*fp32")])
def test_triton_spread_compiles_to_release_then_acquire_spin(splits: int, heads: int, partials: str) -> None:
    """COMBINE spread for sm_90: a barrier, then one acq_rel gpu-scope add of
    EPOCH / splits on the counter; then a loop that polls it with gpu-scope acquire
    loads (Triton lowers the acquire add of 0 to ld.acquire), a barrier in every turn
    (the other threads' later loads follow thread 0's acquire), a branch back; then the
    merge's L2 (.cg) loads. The interpreter build (SPREAD_WAIT False) has no loop."""
    pytest.importorskip("triton")
    module = import_seed_module(SEEDS / "triton_split.py")
    constants = {"TOPK": 2048, "NUM_SPLITS": splits, "HEADS_PER_PROGRAM": heads, "ROWS": 16,
                 "BLOCK_N": 16, "NUM_STAGES": 2, "DOT_F32": False, "FUSED": False,
                 "SPLITS_POW2": splits, "SPREAD": True, "SPREAD_WAIT": True,
                 "SLICE": 512 // splits, "EPOCH_": module.EPOCH}
    lines = _triton_split_ptx(module, 4, partials, **constants).splitlines()
    add = [i for i, x in enumerate(lines) if "atom.global.gpu.acq_rel.add.u32" in x]
    assert len(add) == 1 and [x for x in lines if "atom." in x] == [lines[add[0]]]
    assert "bar.sync" in "\n".join(lines[add[0] - 12:add[0]]), "barrier before the release"
    increment = next(x for x in lines[add[0] - 6:add[0]] if "mov.b32" in x)
    assert increment.rstrip(";").split()[-1] == str(module.EPOCH // splits)
    poll = [i for i, x in enumerate(lines) if "ld.global.gpu.acquire.b32" in x]
    assert len(poll) == 1 and poll[0] > add[0]
    head = max(i for i in range(add[0], poll[0]) if lines[i].startswith("$L__BB"))
    label = lines[head].split(":")[0]
    back = next(i for i in range(poll[0], len(lines)) if lines[i].strip().endswith(f"bra \t{label};")
                or lines[i].split()[-1:] == [f"{label};"])
    assert any("bar.sync" in x for x in lines[poll[0]:back]), "a barrier after each poll"
    assert any("ld.global.cg" in x for x in lines[back:]), "the merge reads the partials from L2"
    # the interpreter's build arrives but never waits
    ptx = _triton_split_ptx(module, 4, partials, **{**constants, "SPREAD_WAIT": False})
    assert "atom.global.gpu.acq_rel.add" in ptx and "acquire.b32" not in ptx


def _spread_cases(module: ModuleType, wl: Workload) -> list[tuple[int, int, int, int, int, int]]:
    """(tokens, groups, topk, wave, target, requested) over every shape of the workload,
    every knob value that reaches the split choice and a range of SM counts."""
    space = load_candidate(SEEDS / "triton_split.yaml", wl.name).space
    tokens = sorted({s.axes["num_tokens"] for s in wl.shapes.values()} | {3, 16, 64, 132, 133, 300})
    waves = [sms * module.RESIDENT_PER_SM for sms in (132, 114, 78, 60, 16, 7, 1)]
    return [(t, 16 // heads, 2048, wave, target, requested)
            for t in tokens for heads in space["HEADS_PER_PROGRAM"].choices for wave in waves
            for target in space["TARGET_PROGRAMS"].choices for requested in space["NUM_SPLITS"].choices]


def test_triton_spread_grid_never_exceeds_one_wave(wl: Workload) -> None:
    """The spin-wait's precondition: every program of a spread grid is resident at once.
    spread_splits keeps ``tokens * groups * splits`` within the wave (SMs x
    RESIDENT_PER_SM) for every shape and knob value, or picks 1 split (nothing waits);
    splits are powers of two dividing EPOCH, at most one per 16 slots."""
    module = import_seed_module(SEEDS / "triton_split.py")
    assert module.RESIDENT_PER_SM == 1, "the docs promise the conservative bound"
    cases = _spread_cases(module, wl)
    assert len(cases) > 1000
    for tokens, groups, topk, wave, target, requested in cases:
        splits = module.spread_splits(tokens, groups, topk, wave, target, requested)
        assert splits >= 1 and splits & (splits - 1) == 0 and module.EPOCH % splits == 0
        assert splits <= topk // 16 and (not requested or splits <= requested)
        assert splits == 1 or tokens * groups * splits <= min(wave, target), (tokens, groups, wave, splits)
        # no power of two more would also fit
        assert (2 * splits > topk // 16 or (requested and 2 * splits > requested)
                or tokens * groups * 2 * splits > min(wave, target))
    h200 = {t: module.spread_splits(t, 1, 2048, 132, 264) for t in (1, 2, 6, 7, 8)}
    assert h200 == {1: 128, 2: 64, 6: 16, 7: 16, 8: 16}, "one token: 128 splits of 16 slots"
    assert module.step_size(32, 2048, 128) == 16 and module.step_size(32, 2048, 16) == 32
    assert module.step_size(64, 2048, 64) == 32 and module.step_size(16, 2048, 1) == 16


def record_launches(module: ModuleType, monkeypatch: pytest.MonkeyPatch
                    ) -> list[tuple[tuple[int, int, int], dict[str, object]]]:
    """triton_split's kernels replaced by a recorder of (grid, keyword arguments), as
    launched on a GPU (not the interpreter's path)."""
    launched: list[tuple[tuple[int, int, int], dict[str, object]]] = []

    class Recorder:
        def __getitem__(self, grid: tuple[int, int, int]) -> Callable[..., None]:
            return lambda *args, **kwargs: launched.append((grid, kwargs))

    monkeypatch.setattr(module, "split_kernel", Recorder())
    monkeypatch.setattr(module, "spread_merge_kernel", Recorder())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return launched


def test_triton_spread_run_launches_at_most_one_wave(wl: Workload, monkeypatch: pytest.MonkeyPatch) -> None:
    """What build()'s run really launches with COMBINE spread, for every shape of the
    workload on a 132-SM and a 16-SM device (kernels replaced by a recorder)."""
    module = import_seed_module(SEEDS / "triton_split.py")
    launched = record_launches(module, monkeypatch)
    for sms in (132, 16):
        monkeypatch.setattr(module, "wave_size", lambda device, resident, sms=sms: sms * resident)
        for heads in (16, 8):
            run = module.build({"COMBINE": "spread", "HEADS_PER_PROGRAM": heads, "NUM_SPLITS": 128})
            for shape in wl.shapes:
                tokens = wl.shapes[shape].axes["num_tokens"]
                launched.clear()
                rows = torch.zeros(tokens, 2048, dtype=torch.int32)
                output, lse = torch.empty(tokens, 16, 512, dtype=torch.bfloat16), torch.empty(tokens, 16)
                run(None, None, None, None, rows, None, output, lse)
                (grid, kwargs), = launched
                splits = grid[0] * grid[1] * grid[2] // (tokens * 16 // heads)
                assert grid == (tokens, 16 // heads, kwargs["NUM_SPLITS"])
                assert kwargs["SPREAD"] == (splits > 1) and kwargs["SPREAD_WAIT"]
                assert splits == 1 or tokens * grid[1] * grid[2] <= sms, (sms, heads, tokens, grid)
                assert kwargs.get("launch_cooperative_grid") is (True if splits > 1 else None)
                assert kwargs["SLICE"] * splits == 512 and kwargs["EPOCH_"] == module.EPOCH


def test_triton_few_token_calls_take_their_own_band(wl: Workload, monkeypatch: pytest.MonkeyPatch) -> None:
    """FEW_TOKENS: calls of at most that many tokens launch with the FEW_ values (heads a
    program, step, splits, warps, stages), the others with the plain ones; with the FEW_
    values equal to the plain ones every call is what it is with one band (FEW_TOKENS 0)."""
    module = import_seed_module(SEEDS / "triton_split.py")
    launched = record_launches(module, monkeypatch)
    monkeypatch.setattr(module, "wave_size", lambda device, resident: 132 * resident)

    def launch(params: dict[str, object], tokens: int) -> tuple[tuple[int, int, int], dict[str, object]]:
        launched.clear()
        module.build(params)(None, None, None, None, torch.zeros(tokens, 2048, dtype=torch.int32), None,
                             torch.empty(tokens, 16, 512, dtype=torch.bfloat16), torch.empty(tokens, 16))
        (call,) = launched
        return call

    seed = load_candidate(SEEDS / "triton_split.yaml", wl.name)
    defaults = dict(seed.params)
    assert defaults["FEW_TOKENS"] > 0 and set(module.BAND_DEFAULTS) <= set(defaults)
    assert {module.FEW + name for name in module.BAND_DEFAULTS} <= set(defaults)
    same = {**defaults, **{module.FEW + name: defaults[name] for name in module.BAND_DEFAULTS}}
    for tokens in (1, 2, 8):
        assert launch(same, tokens) == launch({**same, "FEW_TOKENS": 0}, tokens)
    # the few-token defaults launch what the H200 landscape's sampled point did (one band,
    # 2026-12-07: 9.5 us at one token, 10.0 at two)
    sampled = {**defaults, "FEW_TOKENS": 0, "COMBINE": "spread", "NUM_SPLITS": 32, "MAX_SPLITS": 8,
               "HEADS_PER_PROGRAM": 8, "BLOCK_N": 64, "PARTIALS": "bfloat16", "TARGET_PROGRAMS": 528,
               "num_warps": 4, "num_stages": 1, "COOPERATIVE": 1, "RESIDENT_PER_SM": 1}
    for tokens in (1, 2):
        assert launch(defaults, tokens) == launch(sampled, tokens)
    grid, kwargs = launch(defaults, 1)  # the seed's own bands: 8 heads a program for one token
    assert grid[1] == 16 // defaults["FEW_HEADS_PER_PROGRAM"] and kwargs["HEADS_PER_PROGRAM"] == 8
    grid, kwargs = launch(defaults, 8)
    assert grid[1] == 1 and kwargs["BLOCK_N"] == min(defaults["BLOCK_N"], 2048 // grid[2])
    few = {**defaults, "FEW_TOKENS": 2, "FEW_HEADS_PER_PROGRAM": 8, "FEW_BLOCK_N": 64, "FEW_num_warps": 8,
           "FEW_num_stages": 1, "FEW_NUM_SPLITS": 32, "BLOCK_N": 16}
    for tokens in (1, 2):
        grid, kwargs = launch(few, tokens)
        assert grid == (tokens, 2, 32) and kwargs["HEADS_PER_PROGRAM"] == 8
        assert (kwargs["num_warps"], kwargs["NUM_STAGES"], kwargs["BLOCK_N"]) == (8, 1, 64)
    grid, kwargs = launch(few, 3)
    assert grid == (3, 1, 32) and kwargs["HEADS_PER_PROGRAM"] == 16  # 32 splits: 96 programs of one wave
    assert (kwargs["num_warps"], kwargs["NUM_STAGES"], kwargs["BLOCK_N"]) == (4, 2, 16)
    with pytest.raises(ValueError, match="power-of-two"):
        module.build({**defaults, "FEW_NUM_SPLITS": 6})
    with pytest.raises(ValueError, match="does not divide"):
        module.build({**defaults, "FEW_HEADS_PER_PROGRAM": 5})


def test_triton_spread_two_resident_programs_only_with_a_cooperative_launch(
        wl: Workload, monkeypatch: pytest.MonkeyPatch) -> None:
    """RESIDENT_PER_SM 2 lets a spread grid fill two waves' worth of one SM count (twice
    the splits for 2 to 8 tokens), launched cooperatively so that the driver refuses a
    grid that cannot be co-resident; the manifest and build() refuse it otherwise."""
    module = import_seed_module(SEEDS / "triton_split.py")
    launched = record_launches(module, monkeypatch)
    monkeypatch.setattr(module, "wave_size", lambda device, resident: 132 * resident)
    splits = {}
    for resident in (1, 2):
        run = module.build({"COMBINE": "spread", "RESIDENT_PER_SM": resident})
        for tokens in (1, 2, 8):
            launched.clear()
            rows = torch.zeros(tokens, 2048, dtype=torch.int32)
            run(None, None, None, None, rows, None, torch.empty(tokens, 16, 512, dtype=torch.bfloat16),
                torch.empty(tokens, 16))
            (grid, kwargs), = launched
            assert tokens * grid[2] <= 132 * resident and kwargs["launch_cooperative_grid"] is True
            splits[resident, tokens] = grid[2]
    assert splits == {(1, 1): 128, (1, 2): 64, (1, 8): 16, (2, 1): 128, (2, 2): 128, (2, 8): 32}
    for knobs in ({"COMBINE": "spread", "COOPERATIVE": 0}, {"COMBINE": "fused"}):
        with pytest.raises(ValueError, match="cooperative launch"):
            module.build({**knobs, "RESIDENT_PER_SM": 2})
    seed = load_candidate(SEEDS / "triton_split.yaml", wl.name)
    repaired = seed.with_params(launch={"RESIDENT_PER_SM": 2, "COOPERATIVE": 0}, operator="t").params
    assert repaired["RESIDENT_PER_SM"] == 1 or repaired["COOPERATIVE"] == 1, "the constraint holds"


def _wrap32(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


def test_spread_counters_epochs_over_many_calls() -> None:
    """A model of the spread counter, in int32 as the kernel computes it: over 3000
    consecutive calls with random split counts and arrival orders, starting near the
    int32 wrap, no program passes its wait before the last split of its call arrives,
    every program passes once it has, and the counter ends each call a multiple of EPOCH
    (so no reset is ever needed)."""
    import random

    module = import_seed_module(SEEDS / "triton_split.py")
    epoch = module.EPOCH
    rng = random.Random(0)
    counter = _wrap32(2**31 - 5 * epoch)  # wraps within the first calls
    wrapped = False
    for _ in range(3000):
        splits = rng.choice([2, 4, 8, 16, 32, 64, 128])
        assert counter % epoch == 0
        starts = []
        for k in range(splits):
            old = counter  # what the acq_rel atomic add returns
            counter = _wrap32(counter + epoch // splits)
            wrapped |= counter < old
            starts.append(_wrap32(old - (old & (epoch - 1))))  # as the kernel: old - (old & (EPOCH - 1))
            seen = counter  # the first test uses old + increment, equal to the counter now
            waiting = [_wrap32(seen - start) < epoch for start in starts]
            assert all(waiting) == (k < splits - 1) and (any(waiting) == (k < splits - 1)), (k, splits)
        assert all(_wrap32(counter - start) >= epoch for start in starts)
    assert wrapped, "the model crossed the int32 wrap"


def test_triton_and_cuda_choose_splits_to_fill_the_gpu() -> None:
    for name in ("triton_split.py", "cuda_mma_host.py"):
        choose = import_seed_module(SEEDS / name).choose_splits
        assert choose(1, 1, 2048, 32, 264) == 64, "one token: as many spans as steps allow"
        assert choose(8, 1, 2048, 32, 264) == 64 and choose(8, 2, 2048, 32, 264) == 32
        assert choose(8, 1, 2048, 64, 132) == 32, "no span shorter than one step"
        assert choose(300, 1, 2048, 32, 264) == 1
        assert choose(1, 1, 2048, 32, 264, 16) == 16 and choose(8, 1, 2048, 32, 264, 16) == 16
        assert choose(8, 2, 2048, 32, 132, 64) == 16, "the target binds before the cap"


def _has_nvrtc() -> bool:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:
        return False
    return True


CUDA_CASES = [
    ({}, {}),
    ({"HEADS_PER_CTA": 8, "BLOCK_N": 64}, {"STAGES": 3, "THREADS": 256}),
    ({"BLOCK_N": 16, "NUM_SPLITS": 1}, {"STAGES": 4}),
    ({"COMBINE": "separate"}, {}),
    ({"COMBINE": "fused", "HEADS_PER_CTA": 8, "BLOCK_N": 16}, {"STAGES": 4, "THREADS": 256}),
    ({"COMBINE": "separate", "HEADS_PER_CTA": 8, "BLOCK_N": 64}, {"STAGES": 2, "THREADS": 256}),
    ({"COMBINE": "spread"}, {}),
    ({"COMBINE": "spread", "HEADS_PER_CTA": 8, "BLOCK_N": 16}, {"STAGES": 4, "THREADS": 256}),
    ({"GATHER": "bulk"}, {}),
    ({"GATHER": "bulk", "COMBINE": "spread", "BLOCK_N": 64}, {"STAGES": 3, "THREADS": 256}),
    ({"GATHER": "bulk", "HEADS_PER_CTA": 8, "BLOCK_N": 16}, {"STAGES": 4}),
]
"""COMBINE is fused and GATHER cp_async (the defaults) unless named."""


@pytest.mark.skipif(not _has_nvrtc(), reason="CuPy's NVRTC is not installed")
@pytest.mark.parametrize(("knobs", "launch"), CUDA_CASES)
def test_cuda_seed_compiles_for_sm90a_with_nvrtc(wl: Workload, knobs: dict, launch: dict) -> None:  # type: ignore[type-arg]
    candidate = load_candidate(SEEDS / "cuda_mma.yaml", wl.name)
    if knobs or launch:
        candidate = candidate.with_params(knobs=knobs, launch=launch, operator="test")
    source = cuda_source(candidate)
    cubin, _ = nvrtc_cubin(source, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    assert set(kernel_names(source)) == {"sparse_mla_split", "sparse_mla_combine"}
    assert ("#define COMBINE_FUSED 1" in source) == (candidate.params["COMBINE"] == "fused")
    assert ("#define COMBINE_SPREAD 1" in source) == (candidate.params["COMBINE"] == "spread")
    assert ("#define GATHER_BULK 1" in source) == (candidate.params["GATHER"] == "bulk")


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvrtc(), reason="CuPy's NVRTC is not installed")
def test_cuda_seed_builds_every_compile_time_combination(wl: Workload) -> None:
    """COMBINE, HEADS_PER_CTA, BLOCK_N, GATHER, STAGES and THREADS reach the preprocessor
    (the others are launch arguments): all 216 combinations build for sm_90a."""
    seed = load_candidate(SEEDS / "cuda_mma.yaml", wl.name)
    space = seed.space
    names = ("COMBINE", "HEADS_PER_CTA", "BLOCK_N", "GATHER", "STAGES", "THREADS")

    def build(values: tuple[object, ...]) -> tuple[dict[str, object], bytes]:
        chosen = dict(zip(names, values, strict=True))
        candidate = seed.with_params(knobs={k: v for k, v in chosen.items() if k in seed.knob_space},
                                     launch={k: v for k, v in chosen.items() if k in seed.launch_space},
                                     operator="test")
        cubin, _ = nvrtc_cubin(cuda_source(candidate), "sm_90a")
        return chosen, cubin[:4]

    # NVRTC lets go of the interpreter while it compiles: one thread a core
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        built = list(pool.map(build, itertools.product(*(space[n].choices for n in names))))
    assert len(built) == 216
    for chosen, head in built:
        assert head == b"\x7fELF", chosen


def entry_ptx(wl: Workload, manifest: str, entry: str, knobs: dict[str, object], directory: Path) -> str:
    """The PTX nvcc makes of one kernel (``entry``) of a CUDA seed with these knobs (sm_90a)."""
    candidate = load_candidate(SEEDS / manifest, wl.name).with_params(knobs=knobs, operator="test")
    (directory / "k.cu").write_text(cuda_source(candidate))
    subprocess.run(["nvcc", "-arch=sm_90a", "-ptx", "-o", str(directory / "k.ptx"), str(directory / "k.cu")],
                   check=True, capture_output=True, timeout=300)
    ptx = (directory / "k.ptx").read_text()
    start = ptx.index(f".entry {entry}(")
    end = ptx.find(".entry", start + 1)
    return ptx[start:end if end > 0 else len(ptx)]


def split_kernel_ptx(wl: Workload, knobs: dict[str, object], directory: Path) -> str:
    """The PTX nvcc makes of cuda_mma's split kernel with these knobs (sm_90a)."""
    return entry_ptx(wl, "cuda_mma.yaml", "sparse_mla_split", knobs, directory)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_cuda_seed_fused_merge_compiles_to_one_release_acquire_arrival(wl: Workload, tmp_path: Path) -> None:
    """COMBINE fused: the split kernel has the arrival atomic (acq_rel, gpu scope) between
    fences and reads partials through L2; COMBINE separate has no atomic at all; COMBINE
    spread has the acq_rel add (of a register: EPOCH / splits), then a loop polling the
    counter with ld.acquire.gpu, then the merge's L2 loads."""
    for combine in ("fused", "separate", "spread"):
        split = split_kernel_ptx(wl, {"COMBINE": combine}, tmp_path)
        if combine == "fused":
            assert "atom.acq_rel.gpu.global.add.u32" in split and "membar.gl" in split
            assert "ld.global.cg.v4.f32" in split
        elif combine == "spread":
            lines = split.splitlines()
            add = [i for i, x in enumerate(lines) if "atom.acq_rel.gpu.global.add.u32" in x]
            poll = [i for i, x in enumerate(lines) if "ld.acquire.gpu.global.u32" in x]
            assert len(add) == 1 and len(poll) == 1 and add[0] < poll[0]
            assert "membar.gl" in "\n".join(lines[add[0] - 8:add[0]]), "a fence before the release"
            assert sum("atom." in x for x in lines) == 1 and "nanosleep" in split
            labels = [x.split(":")[0] for x in lines[add[0]:poll[0]] if x.startswith("$L__BB")]
            assert any(f"bra.uni \t{label};" in split or f"bra \t{label};" in split for label in labels), (
                "a branch back to the poll")
            assert "ld.global.cg.v4.f32" in "\n".join(lines[poll[0]:])
            assert "shfl.sync.bfly" in split
        else:
            assert "atom." not in split


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_cuda_seed_bulk_gather_counts_its_copies_on_one_mbarrier_per_buffer(wl: Workload, tmp_path: Path) -> None:
    """GATHER bulk: the split kernel initialises its barriers (and fences the init) before
    the first gather, gathers rows only by bulk copies completing on an mbarrier (the
    only 16-byte cp.async copies are the queries', before them), announces the bytes
    with one expect_tx arrival per tile after an async-proxy fence, and waits on the
    buffer's phase before reading it; GATHER cp_async has none of these."""
    bulk = split_kernel_ptx(wl, {"GATHER": "bulk"}, tmp_path)
    lines = bulk.splitlines()

    def first(text: str) -> int:
        return next(i for i, x in enumerate(lines) if text in x)

    assert first("mbarrier.init.shared") < first("fence.mbarrier_init") < first("cp.async.bulk.shared::cluster")
    assert "mbarrier::complete_tx::bytes" in bulk
    assert first("fence.proxy.async") < first("mbarrier.arrive.expect_tx") < first("cp.async.bulk.shared::cluster")
    assert first("mbarrier.try_wait.parity") < first("ldmatrix")
    copies = [i for i, x in enumerate(lines) if "cp.async.cg.shared.global" in x]
    assert copies and max(copies) < first("cp.async.bulk.shared::cluster")  # the queries' copies only
    plain = split_kernel_ptx(wl, {"GATHER": "cp_async"}, tmp_path)
    assert "mbarrier" not in plain and "cp.async.bulk" not in plain


def resident_candidates(wl: Workload) -> list[Candidate]:
    """cuda_resident at every valid combination of the parameters that reach its
    preprocessor (MAX_ROWS, BLOCK_N, GATHER, THREADS, CTAS_PER_SM, CLUSTER)."""
    seed = load_candidate(SEEDS / "cuda_resident.yaml", wl.name)
    names = ("MAX_ROWS", "BLOCK_N", "GATHER", "THREADS", "CTAS_PER_SM", "CLUSTER")
    found = []
    for values in itertools.product(*(seed.space[n].choices for n in names)):
        chosen = dict(zip(names, values, strict=True))
        if chosen["MAX_ROWS"] < chosen["BLOCK_N"] or (chosen["CTAS_PER_SM"] == 2 and chosen["MAX_ROWS"] > 64):
            continue  # the manifest's constraints
        found.append(seed.with_params(knobs={k: v for k, v in chosen.items() if k in seed.knob_space},
                                      launch={k: v for k, v in chosen.items() if k in seed.launch_space},
                                      operator="test"))
    return found


def test_resident_constraints_keep_what_cannot_build_or_fit_out_of_the_space(wl: Workload) -> None:
    """A group wider than the round, and two CTAs an SM of 128 resident rows each, are
    declared constraints: asking for them gets the nearest valid combination instead."""
    seed = load_candidate(SEEDS / "cuda_resident.yaml", wl.name)
    two = seed.with_params(launch={"CTAS_PER_SM": 2}, operator="test")  # MAX_ROWS 128 by default
    assert two.params["CTAS_PER_SM"] == 2 and two.params["MAX_ROWS"] <= 64
    wide = seed.with_params(knobs={"BLOCK_N": 64, "MAX_ROWS": 32}, operator="test")
    assert wide.params["MAX_ROWS"] >= wide.params["BLOCK_N"]
    assert len(resident_candidates(wl)) == 3 * (2 * 2 * (3 + 3 + 2) + 2 * 2 * (3 + 2))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_resident_host_mirrors_the_kernels_shared_memory(wl: Workload, tmp_path: Path) -> None:
    """cuda_resident_host.shared_bytes equals the kernel's SMEM_BYTES (checked by a
    static_assert nvcc compiles), one CTA of 128 rows fits an sm_90 block's 227 KiB, and
    two CTAs of 64 rows (CTAS_PER_SM 2) fit an SM's 228 KiB with their 1 KiB reserves."""
    host = import_seed_module(SEEDS / "cuda_resident_host.py")
    for candidate in resident_candidates(wl):
        p = candidate.params
        need = host.shared_bytes(p["THREADS"], p["BLOCK_N"], p["MAX_ROWS"])
        assert need <= 227 * 1024
        if p["CTAS_PER_SM"] == 2:
            assert 2 * (need + 1024) <= 228 * 1024, p
    for candidate in resident_candidates(wl)[::7]:  # nvcc is slow: a spread of them
        p = candidate.params
        need = host.shared_bytes(p["THREADS"], p["BLOCK_N"], p["MAX_ROWS"])
        probe = tmp_path / "probe.cu"
        probe.write_text(cuda_source(candidate) + f'\nstatic_assert(SMEM_BYTES == {need}, "host and kernel");\n')
        done = subprocess.run(["nvcc", "-arch=sm_90a", "-c", "-o", str(tmp_path / "probe.o"), str(probe)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (p, done.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvrtc(), reason="CuPy's NVRTC is not installed")
def test_resident_seed_builds_every_compile_time_combination(wl: Workload) -> None:
    """Every valid combination of the preprocessor's parameters builds for sm_90a, and a
    spread of them with bf16 partials (PARTIALS touches only the spread merge's loads and
    the partials' stores)."""

    def build(candidate: Candidate) -> bytes:
        cubin, _ = nvrtc_cubin(cuda_source(candidate), "sm_90a")
        return cubin[:4]

    candidates = resident_candidates(wl)
    candidates += [c.with_params(knobs={"PARTIALS": "bfloat16"}, operator="test") for c in candidates[::5]]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # NVRTC lets go of the interpreter
        heads = list(pool.map(build, candidates))
    assert heads == [b"\x7fELF"] * len(candidates)
    assert set(kernel_names(cuda_source(candidates[0]))) == {"sparse_mla_resident", "sparse_mla_resident_cluster"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_resident_merge_compiles_to_a_bounded_acquire_poll(wl: Workload, tmp_path: Path) -> None:
    """The merge's wait: one acq_rel add after a fence, then a poll by ld.acquire.gpu with
    a nanosleep, a trap on the path out of it (SPIN_LIMIT), then L2 loads of partials."""
    lines = entry_ptx(wl, "cuda_resident.yaml", "sparse_mla_resident", {}, tmp_path).splitlines()
    add = [i for i, x in enumerate(lines) if "atom.acq_rel.gpu.global.add.u32" in x]
    poll = [i for i, x in enumerate(lines) if "ld.acquire.gpu.global.u32" in x]
    assert len(add) == 1 and len(poll) == 1 and add[0] < poll[0]
    assert "membar.gl" in "\n".join(lines[add[0] - 8:add[0]]), "a fence before the release"
    assert any("nanosleep" in x for x in lines[add[0]:poll[0] + 1])
    assert any("trap;" in x for x in lines[add[0]:poll[0] + 1]), "the wait is bounded (SPIN_LIMIT)"
    assert any("ld.global.cg.v4.f32" in x for x in lines[poll[0]:])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_resident_bf16_partials_halve_the_merges_loads(wl: Workload, tmp_path: Path) -> None:
    """PARTIALS bfloat16: the partials leave as packed bf16 (8-byte stores) and the merge
    reads them by 8-byte L2 loads; no 16-byte float partial load is left."""
    lines = entry_ptx(wl, "cuda_resident.yaml", "sparse_mla_resident", {"PARTIALS": "bfloat16"},
                      tmp_path).splitlines()
    poll = [i for i, x in enumerate(lines) if "ld.acquire.gpu.global.u32" in x]
    assert len(poll) == 1
    merge = lines[poll[0]:]
    assert any("ld.global.cg.v2.u32" in x or "ld.global.cg.v2.b32" in x for x in merge)
    assert not any("ld.global.cg.v4.f32" in x for x in merge)
    before = lines[:poll[0]]
    assert any("cvt.rn.bf16x2.f32" in x for x in before) and any("st.global.v2" in x for x in before)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_resident_cluster_kernel_merges_through_distributed_shared_memory(wl: Workload, tmp_path: Path) -> None:
    """CLUSTER 16: the cluster kernel is declared with 16-CTA clusters, has no global
    atomics, and reads the other spans' outputs with ld.shared::cluster between two
    release/acquire cluster barriers (the second one after the last remote read)."""
    entry = entry_ptx(wl, "cuda_resident.yaml", "sparse_mla_resident_cluster", {"CLUSTER": 16}, tmp_path)
    assert ".reqnctapercluster 16, 1, 1" in entry
    lines = entry.splitlines()
    arrive = [i for i, x in enumerate(lines) if "barrier.cluster.arrive.release" in x]
    wait = [i for i, x in enumerate(lines) if "barrier.cluster.wait.acquire" in x]
    remote = [i for i, x in enumerate(lines) if "ld.shared::cluster" in x]
    assert len(arrive) == 2 and len(wait) == 2 and remote
    assert wait[0] < min(remote) and max(remote) < arrive[1]
    assert "atom." not in entry


@pytest.mark.parametrize(("cluster", "first"), [(16, 4), (8, 1), (0, 4)])
def test_resident_host_dispatches_by_token_count(wl: Workload, cluster: int, first: int) -> None:
    """With CLUSTER set, a call of at least CLUSTER_FROM_TOKENS tokens launches the cluster
    kernel on a (CLUSTER, T) grid, one span per CTA of the token's cluster, and nothing
    else (no workspace); fewer tokens, or CLUSTER 0, the spread kernel on (T, splits)."""
    host = import_seed_module(SEEDS / "cuda_resident_host.py")
    host.wave_size = lambda device, ctas_per_sm: 132 * ctas_per_sm
    launches: list[tuple[str, tuple[int, ...], tuple[object, ...]]] = []

    class Kernels:
        def __getitem__(self, name: str):  # type: ignore[no-untyped-def]
            return lambda grid, block, *args, shared_mem: launches.append((name, grid, args))

    run = host.build({"CLUSTER": cluster, "CLUSTER_FROM_TOKENS": first}, Kernels())
    unused = torch.zeros(1)  # queries, caches and scale: only passed on
    for tokens in (1, 2, 6, 8):
        indices = torch.zeros(tokens, 2048, dtype=torch.int32)
        run(unused, unused, unused, unused, indices, unused, torch.zeros(tokens, 16, 512), torch.zeros(tokens, 16))
    for (name, grid, args), tokens in zip(launches, (1, 2, 6, 8), strict=True):
        if cluster and tokens >= first:
            assert name == "sparse_mla_resident_cluster" and grid == (cluster, tokens, 1)
            assert args[-3:] == (2048, cluster, 2048 // cluster)
        else:
            splits = host.spread_splits(tokens, 2048, 132, 264)
            assert name == "sparse_mla_resident" and grid == (tokens, splits, 1)
            assert args[-3:] == (2048, splits, 2048 // splits)


def test_resident_spread_splits_fit_one_wave(wl: Workload) -> None:
    """cuda_resident's spans: one wave at most (or one span), powers of two dividing
    EPOCH, at most 128, over every shape, SM count and knob value; on a 132-SM H200 every
    contest shape runs spans of at most 128 slots (one round of the default MAX_ROWS)."""
    host = import_seed_module(SEEDS / "cuda_resident_host.py")
    space = load_candidate(SEEDS / "cuda_resident.yaml", wl.name).space
    tokens = sorted({s.axes["num_tokens"] for s in wl.shapes.values()} | {3, 16, 64, 132, 133, 300})
    for t, sms, per_sm, target, requested in itertools.product(
            tokens, (132, 114, 16, 1), space["CTAS_PER_SM"].choices, space["TARGET_CTAS"].choices,
            space["NUM_SPLITS"].choices):
        splits = host.spread_splits(t, 2048, sms * per_sm, target, requested)
        assert splits & (splits - 1) == 0 and 1024 % splits == 0 and splits <= host.MAX_SPREAD
        assert splits == 1 or t * splits <= min(sms * per_sm, target)
        assert not requested or splits <= requested
    spans = {t: 2048 // host.spread_splits(t, 2048, 132, 264) for t in (1, 2, 6, 7, 8)}
    assert spans == {1: 16, 2: 32, 6: 128, 7: 128, 8: 128}
    assert {t: 2048 // host.spread_splits(t, 2048, 264, 264) for t in (6, 8)} == {6: 64, 8: 64}


def test_cuda_spread_splits_fit_one_wave(wl: Workload) -> None:
    """cuda_mma's spread_splits: one wave at most (or one span), powers of two dividing
    EPOCH, at most 128 spans of 16 slots, over every shape and knob value."""
    host = import_seed_module(SEEDS / "cuda_mma_host.py")
    space = load_candidate(SEEDS / "cuda_mma.yaml", wl.name).space
    assert host.RESIDENT_PER_SM == 1
    tokens = sorted({s.axes["num_tokens"] for s in wl.shapes.values()} | {3, 16, 64, 132, 133, 300})
    for t, heads, sms, target, requested in itertools.product(
            tokens, space["HEADS_PER_CTA"].choices, (132, 114, 78, 16, 1), space["TARGET_CTAS"].choices,
            space["NUM_SPLITS"].choices):
        groups = 16 // heads
        splits = host.spread_splits(t, groups, 2048, sms, target, requested)
        assert splits & (splits - 1) == 0 and host.EPOCH % splits == 0 and splits <= host.MAX_SPREAD
        assert splits == 1 or t * groups * splits <= min(sms, target)
        assert not requested or splits <= requested
        assert 512 % (4 * splits) == 0, "the kernel's slice: whole float4s"
    assert {t: host.spread_splits(t, 1, 2048, 132, 264) for t in (1, 2, 6, 7, 8)} == {
        1: 128, 2: 64, 6: 16, 7: 16, 8: 16}


@pytest.mark.parametrize("threads", [128, 256])
@pytest.mark.parametrize("heads", [16, 8])
def test_cuda_spread_merge_covers_every_column_once(heads: int, threads: int) -> None:
    """A model of the spread merge's index arithmetic in cuda_mma.cu (it, lanes, v, r, h,
    c4), which only a GPU runs: over the CTAs of one (token, head group), every
    (head, float4 column) is written once, by the lane r == 0 of a group of `lanes`
    consecutive threads of one warp that between them read every split once."""
    for splits in (2, 4, 8, 16, 32, 64, 128):
        slice4 = 512 // 4 // splits
        vecs = heads * slice4
        lanes = 1 if vecs >= threads else threads // vecs
        assert lanes <= 32 and 32 % lanes == 0 and (vecs * lanes) % threads == 0
        written: dict[tuple[int, int], int] = {}
        for split in range(splits):
            reads: dict[tuple[int, int], list[int]] = {}
            for tid in range(threads):
                for it in range(tid, vecs * lanes, threads):
                    v, r = divmod(it, lanes)
                    h = v // slice4
                    c4 = split * slice4 + (v - h * slice4)
                    assert (it - r) // 32 == (it - r + lanes - 1) // 32, "a lane group within one warp"
                    reads.setdefault((h, c4), []).extend(range(r, splits, lanes))
                    if r == 0:
                        written[(h, c4)] = written.get((h, c4), 0) + 1
            assert all(sorted(x) == list(range(splits)) for x in reads.values())
        assert written == {(h, c): 1 for h in range(heads) for c in range(128)}, splits


@pytest.mark.skipif(shutil.which("cpp") is None, reason="no C preprocessor")
@pytest.mark.parametrize("block_n", [16, 32, 64])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_cuda_host_reserves_the_shared_memory_the_kernel_lays_out(
    wl: Workload, block_n: int, stages: int
) -> None:
    """The host's shared_bytes() against SMEM_BYTES as the .cu's preprocessor computes it."""
    candidate = load_candidate(SEEDS / "cuda_mma.yaml", wl.name).with_params(
        knobs={"BLOCK_N": block_n}, launch={"STAGES": stages}, operator="test")
    probe = cuda_source(candidate) + "\nSMEM_PROBE SMEM_BYTES PIPE\n"
    proc = subprocess.run(["cpp", "-P", "-x", "c", "-"], input=probe, capture_output=True,
                          text=True, timeout=60, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SMEM_PROBE"))
    expression, depth = line.removeprefix("SMEM_PROBE").rsplit(maxsplit=1)
    assert set(expression) <= set("0123456789+-*() ")
    host = import_seed_module(SEEDS / "cuda_mma_host.py")
    assert host.shared_bytes(block_n, stages) == eval(expression) <= 232448
    assert host.pipeline_depth(block_n, stages) == int(depth)
