"""dsa_sparse_attention's cuda_resident seed run by the CPU emulation of its kernel
(tests/workloads/cuda_emulation), through the seed's own host code.

Every CTA waits for the other spans of its token before merging, so the grid runs with
all its blocks at once (``grid_at_once``) and the host's wave set to EMULATED_WAVE CTAs:
one token then has 16 spans of 128 slots (one round each), eight tokens 2 spans of 1024
slots (eight rounds of 128, the online rescaling between rounds). Copies land as late as
the program allows, so reading rows before their group's wait fails the checker here as
it would on a GPU; a wrong byte count on a bulk group's mbarrier, and a wait that never
ends, fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evokernel.candidate import Candidate
from evokernel.evaluate.build import import_sources
from evokernel.workload import Workload, load_workload
from tests.workloads import cuda_emulation
from tests.workloads.test_dsa_sparse_attention_cuda_emulated import configured as configured_seed
from tests.workloads.test_dsa_sparse_attention_cuda_emulated import judge, with_padding

SEED = Path(__file__).resolve().parents[2] / "workloads" / "dsa_sparse_attention" / "seeds" / "cuda_resident.yaml"
SOURCE = "cuda_resident.cu"
EMULATED_WAVE = 16
"""CTAs the host may count on being resident at once (SMs times CTAS_PER_SM on a GPU)."""

pytestmark = pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on PATH")


@pytest.fixture(scope="module")
def wl() -> Workload:
    return load_workload("dsa_sparse_attention")


def configured(values: dict[str, Any]) -> Candidate:
    return configured_seed(values, SEED)


def emulated(candidate: Candidate, directory: Path, source: str | None = None, grid_at_once: bool = True) -> Any:
    """The seed's host ``run`` over its kernel compiled for the CPU, a wave of
    EMULATED_WAVE CTAs, every block of a launch at once unless told otherwise."""
    host = import_sources(candidate, directory)
    host.wave_size = lambda device, ctas_per_sm: EMULATED_WAVE  # the host asks torch.cuda otherwise
    kernels = cuda_emulation.emulate(source or candidate.sources[SOURCE], candidate.params, directory,
                                     grid_at_once=grid_at_once)
    return host.build(dict(candidate.params), kernels)


def mutant(values: dict[str, Any], tmp_path: Path, old: str, new: str) -> Any:
    """The seed at ``values`` with its one occurrence of ``old`` replaced by ``new``."""
    candidate = configured(values)
    source = candidate.sources[SOURCE]
    assert source.count(old) == 1
    return emulated(candidate, tmp_path, source.replace(old, new))


CONFIGURATIONS = [
    {},                                                    # defaults: 256 threads, 128 rows, cp.async
    {"GATHER": "bulk"},
    {"THREADS": 128, "BLOCK_N": 64, "GATHER": "bulk"},     # one warp job per column tile... two
    {"BLOCK_N": 16, "MAX_ROWS": 64, "CTAS_PER_SM": 2},     # 16-slot groups, rounds of 64
    {"MAX_ROWS": 32, "NUM_SPLITS": 8},                     # four rounds a span on one token
    {"PARTIALS": "bfloat16"},                              # bf16 partials between span and merge
    {"PARTIALS": "bfloat16", "THREADS": 128, "MAX_ROWS": 64, "BLOCK_N": 16},
]


@pytest.mark.slow
@pytest.mark.parametrize("values", CONFIGURATIONS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "defaults")
def test_emulated_kernel_passes_the_checker(wl: Workload, tmp_path: Path, values: dict[str, Any]) -> None:
    """On the 1- and 8-token smoke shapes, twice with one built runner (the counters'
    epochs and the workspace reused): full index rows, then rows whose last 1007 slots
    are -1 (whole copy groups of nothing, and one cut mid-way)."""
    run = emulated(configured(values), tmp_path)
    for shape in (wl.subsets["smoke"][0], wl.subsets["smoke"][2]):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))
        judge(wl, run, shape, with_padding(wl.make_inputs(shape, 2, "cpu"), keep=1048 - 7))


CLUSTER_CONFIGURATIONS = [
    {"CLUSTER": 16, "CLUSTER_FROM_TOKENS": 1},                          # 16 spans of 128, one round
    {"CLUSTER": 8, "CLUSTER_FROM_TOKENS": 1, "GATHER": "bulk", "THREADS": 128},  # 8 of 256, two rounds
]


@pytest.mark.slow
@pytest.mark.parametrize("values", CLUSTER_CONFIGURATIONS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_emulated_cluster_merge_passes_the_checker(wl: Workload, tmp_path: Path, values: dict[str, Any]) -> None:
    """The cluster kernel on both smoke shapes, clusters run one after another (nothing
    waits across clusters), with and without -1 padding, twice on one runner; a span read
    before the cluster barrier, or a CTA leaving while others still read it, would fault."""
    run = emulated(configured(values), tmp_path, grid_at_once=False)
    for shape in (wl.subsets["smoke"][0], wl.subsets["smoke"][2]):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))
        judge(wl, run, shape, with_padding(wl.make_inputs(shape, 2, "cpu"), keep=1048 - 7))


@pytest.mark.slow
def test_a_cluster_merge_without_its_barrier_is_caught(wl: Workload, tmp_path: Path) -> None:
    """Reading the other spans' staged outputs before the cluster barrier reads them as
    they were before (junk): the emulation faults or the checker fails."""
    candidate = configured({"CLUSTER": 8, "CLUSTER_FROM_TOKENS": 1})
    source = candidate.sources[SOURCE]
    old = "    cluster_sync();\n    // [HEADS][CLUSTER_SIZE] weights"
    assert source.count(old) == 1
    run = emulated(candidate, tmp_path, source.replace(old, "    // [HEADS][CLUSTER_SIZE] weights"),
                   grid_at_once=False)
    shape = wl.subsets["smoke"][0]
    with pytest.raises((AssertionError, cuda_emulation.EmulationFault)):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))


@pytest.mark.slow
@pytest.mark.parametrize(("values", "wait", "early"), [
    ({}, "cp_async_wait_pending(groups - 1 - gr);", "cp_async_wait_pending(groups - gr);"),
    ({"GATHER": "bulk"}, "mbar_wait(smem_u32(sm.bar + gr), round & 1);", "(void)0;"),
], ids=["cp_async", "bulk"])
def test_reading_rows_before_their_group_lands_is_caught(
    wl: Workload, tmp_path: Path, values: dict[str, Any], wait: str, early: str
) -> None:
    """A kernel that waits for one copy group too few, or not at all on the mbarrier,
    reads rows that have not landed (NaN junk in the emulation) and fails the checker."""
    run = mutant(values, tmp_path, wait, early)
    shape = wl.subsets["smoke"][0]
    with pytest.raises(AssertionError, match=r"differ|NaN values"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))


@pytest.mark.slow
def test_a_wrong_byte_count_on_the_mbarrier_is_caught(wl: Workload, tmp_path: Path) -> None:
    """A bulk group announcing 16 bytes a row more than it copies never completes its
    phase: on a GPU a hang, here a fault."""
    run = mutant({"GATHER": "bulk"}, tmp_path, "valid_rows * (u32)(DIM * 2)", "valid_rows * (u32)(DIM * 2 + 16)")
    shape = wl.subsets["smoke"][0]
    with pytest.raises(cuda_emulation.EmulationFault, match="never completed"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))


@pytest.mark.slow
def test_a_merge_wait_that_never_ends_is_caught(wl: Workload, tmp_path: Path) -> None:
    """Each span adding one less than its share of EPOCH leaves the counter short: on a
    GPU the wait would end in the kernel's trap after SPIN_LIMIT polls; here the
    emulation's polling limit faults first."""
    run = mutant({}, tmp_path, "const u32 add = EPOCH / (u32)splits;", "const u32 add = EPOCH / (u32)splits - 1u;")
    shape = wl.subsets["smoke"][0]
    with pytest.raises(cuda_emulation.EmulationFault, match=r"polled for more than|__trap"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))


@pytest.mark.slow
def test_a_grid_run_a_block_at_a_time_never_finishes(wl: Workload, tmp_path: Path) -> None:
    """The merge needs its whole grid resident: run a block at a time (as an oversized
    grid would be on a GPU), the first block would wait for the others for ever: the
    kernel's SPIN_LIMIT trap (or the emulation's own polling limit) ends it."""
    run = emulated(configured({}), tmp_path, grid_at_once=False)
    shape = wl.subsets["smoke"][0]
    with pytest.raises(cuda_emulation.EmulationFault, match=r"grid_at_once|__trap"):
        judge(wl, run, shape, wl.make_inputs(shape, 1, "cpu"))
