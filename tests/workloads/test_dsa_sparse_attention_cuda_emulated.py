"""dsa_sparse_attention's cuda_mma seed run by the CPU emulation of its kernels
(tests/workloads/cuda_emulation), through the seed's own host code.

cuda_mma passed all 23 shapes on the H200 with cp.async gathers (README); here the
emulation gives the same verdict for those configurations, which checks the emulation's
ldmatrix and bf16 mma models against hardware (and two kernels that read a stage before
its copies land fail here, as they would there), and then checks the unmeasured bulk-copy
gather (GATHER bulk: mbarriers whose announced bytes must equal the bytes copied, or the
emulated wait traps) on rows with -1 slots, whose shared-memory rows must be zeroed (the
emulation leaves shared memory NaN until written). COMBINE spread, whose CTAs wait for
each other, runs with every block of the grid at once (``grid_at_once``) and the host's
one-wave cap set to 16 CTAs, so that a grid of 16 blocks is its whole wave.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from evokernel.candidate import Candidate, load_candidate
from evokernel.evaluate.build import import_sources
from evokernel.evaluate.check import check_outputs
from evokernel.workload import Workload, load_workload
from tests.workloads import cuda_emulation

SEED = Path(__file__).resolve().parents[2] / "workloads" / "dsa_sparse_attention" / "seeds" / "cuda_mma.yaml"

pytestmark = pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on PATH")


@pytest.fixture(scope="module")
def wl() -> Workload:
    return load_workload("dsa_sparse_attention")


def configured(values: dict[str, Any], manifest: Path = SEED) -> Candidate:
    """The seed of ``manifest`` (cuda_mma by default) with ``values`` set, knobs and launch
    parameters alike."""
    seed = load_candidate(manifest, "dsa_sparse_attention")
    return seed.with_params(knobs={k: v for k, v in values.items() if k in seed.knob_space},
                            launch={k: v for k, v in values.items() if k in seed.launch_space},
                            operator="test")


EMULATED_WAVE = 16
"""CTAs the host may count on being resident at once (its SM count times RESIDENT_PER_SM on
a GPU); the emulation runs that many blocks of 128-256 threads at once as OS threads."""


def emulated(candidate: Candidate, directory: Path, source: str | None = None,
             grid_at_once: bool | None = None) -> Any:
    """The seed's host ``run`` over its kernels compiled for the CPU (for the spread merge,
    a wave of EMULATED_WAVE CTAs and, unless ``grid_at_once`` says otherwise, every block
    of a launch at once)."""
    host = import_sources(candidate, directory)
    spread = candidate.params.get("COMBINE") == "spread"
    if spread:
        host.wave_size = lambda device: EMULATED_WAVE  # the host asks torch.cuda otherwise
    kernels = cuda_emulation.emulate(source or candidate.sources["cuda_mma.cu"], candidate.params, directory,
                                     grid_at_once=spread if grid_at_once is None else grid_at_once)
    return host.build(dict(candidate.params), kernels)


def with_padding(inputs: dict[str, torch.Tensor], keep: int) -> dict[str, torch.Tensor]:
    """Only the first ``keep`` slots of each token's index row valid, the rest -1."""
    indices = inputs["sparse_indices"].clone()
    indices[:, keep:] = -1
    return {**inputs, "sparse_indices": indices}


def judge(wl: Workload, run: Any, shape: str, inputs: dict[str, torch.Tensor]) -> None:
    outputs = wl.allocate_outputs(shape, "cpu")
    for out in outputs:
        out.fill_(float("nan"))
    run(*inputs.values(), *outputs)
    refs = wl.reference(*inputs.values())
    verdict = check_outputs(wl, list(outputs), list(refs), inputs)
    assert verdict.ok, verdict.message


ONE_TOKEN_ONLY = {"BLOCK_N": 16}
"""Configurations judged on the 1-token shape alone: 16-row tiles with 8 heads a CTA make
the 8-token shape's emulation take minutes (219 s of a CI run), and 8 heads a CTA on 8
tokens is judged with the spread merge below."""

CONFIGURATIONS = [
    {},                                                     # fused merge, cp.async gathers
    {"GATHER": "bulk"},
    {"GATHER": "bulk", "COMBINE": "separate", "BLOCK_N": 64, "STAGES": 3, "THREADS": 256},
    {"GATHER": "bulk", "HEADS_PER_CTA": 8, "BLOCK_N": 16, "STAGES": 4},      # 1 token only
    {"COMBINE": "spread"},                                  # the two configurations the GPU plan
    {"COMBINE": "spread", "GATHER": "bulk"},                # measures next
    {"COMBINE": "spread", "HEADS_PER_CTA": 8, "NUM_SPLITS": 8},
]


@pytest.mark.slow
@pytest.mark.parametrize("values", CONFIGURATIONS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "defaults")
def test_emulated_kernels_pass_the_checker(wl: Workload, tmp_path: Path, values: dict[str, Any]) -> None:
    """On the 1- and 8-token smoke shapes (the 1-token one alone for ``ONE_TOKEN_ONLY``),
    twice with one built runner (the fused merge's
    counters and workspace reused): full index rows, then rows whose last 1000 slots are
    -1 (whole gather tiles of nothing, and a tile cut mid-way)."""
    run = emulated(configured(values), tmp_path)
    one_token = all(values.get(k) == v for k, v in ONE_TOKEN_ONLY.items())
    shapes = (wl.subsets["smoke"][0],) if one_token else (wl.subsets["smoke"][0], wl.subsets["smoke"][2])
    for shape in shapes:
        inputs = wl.make_inputs(shape, 1, "cpu")
        judge(wl, run, shape, inputs)
        judge(wl, run, shape, with_padding(wl.make_inputs(shape, 2, "cpu"), keep=1048 - 7))


def mutant(values: dict[str, Any], tmp_path: Path, old: str, new: str) -> Any:
    """The seed at ``values`` with its one occurrence of ``old`` replaced by ``new``,
    built for the emulation (a mutation the tests expect to be caught)."""
    candidate = configured(values)
    source = candidate.sources["cuda_mma.cu"]
    assert source.count(old) == 1
    return emulated(candidate, tmp_path, source.replace(old, new))


@pytest.mark.slow
def test_a_wrong_byte_count_on_the_mbarrier_is_caught(wl: Workload, tmp_path: Path) -> None:
    """The bulk gather announcing 16 bytes a row more than it copies never completes its
    barrier's phase: on a GPU a hang, here a fault (so the tests above could fail)."""
    run = mutant({"GATHER": "bulk"}, tmp_path, "valid_rows * (u32)(DIM * 2)",
                 "valid_rows * (u32)(DIM * 2 + 16)")
    shape = wl.subsets["smoke"][0]
    with pytest.raises(cuda_emulation.EmulationFault, match="never completed"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))


@pytest.mark.slow
@pytest.mark.parametrize(("values", "wait", "early"), [
    ({}, "cp_async_wait<PIPE - 1>();", "cp_async_wait<PIPE>();"),
    ({"GATHER": "bulk"}, "mbar_wait(smem_u32(sm.bar + tile % PIPE), (tile / PIPE) & 1);", "(void)0;"),
], ids=["cp_async", "bulk"])
def test_reading_a_stage_before_its_copies_land_is_caught(
    wl: Workload, tmp_path: Path, values: dict[str, Any], wait: str, early: str
) -> None:
    """Copies land at the wait that retires them, so a kernel that waits for one group too
    few, or not at all on the mbarrier, reads stale shared memory and fails the checker."""
    run = mutant(values, tmp_path, wait, early)
    shape = wl.subsets["smoke"][0]
    with pytest.raises(AssertionError, match="differ"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))


@pytest.mark.slow
def test_a_spread_wait_that_never_ends_is_caught(wl: Workload, tmp_path: Path) -> None:
    """Each split adding one less than its share of EPOCH leaves the counter short of a
    whole EPOCH: on a GPU every CTA of the call spins for ever; here the polling traps."""
    run = mutant({"COMBINE": "spread"}, tmp_path, "const u32 add = EPOCH / (u32)splits;",
                 "const u32 add = EPOCH / (u32)splits - 1u;")
    shape = wl.subsets["smoke"][0]
    with pytest.raises(cuda_emulation.EmulationFault, match="polled for more than"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))


@pytest.mark.slow
def test_spread_blocks_run_one_at_a_time_never_finish(wl: Workload, tmp_path: Path) -> None:
    """The spread merge needs its whole grid resident: run a block at a time (what the
    emulation does without grid_at_once, and what an oversized grid does on a GPU), the
    first block waits for the others for ever and the emulation says so."""
    run = emulated(configured({"COMBINE": "spread"}), tmp_path, grid_at_once=False)
    shape = wl.subsets["smoke"][0]
    with pytest.raises(cuda_emulation.EmulationFault, match="grid_at_once"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))
