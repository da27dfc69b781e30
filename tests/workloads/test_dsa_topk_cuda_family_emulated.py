"""dsa_topk's cuda_family seed run by the CPU emulation of its kernels
(tests/workloads/cuda_emulation), through the seed's own host code.

The family passed every configuration judged on the H200 (its defaults then, the hand
choice, their one-parameter changes and 200 uniform draws, README); here the emulation
gives the same verdict for the hand choice and every one-parameter change of it, for
the manifest's defaults (the measured best since), and for a handful of
combinations, on small inputs that reach each of the host's five paths (pt_topk and the
four scoring bands): that calibrates the emulation's models of the fp8 and f16
mma.sync fragments, of wgmma (descriptors, both layouts, the accumulator fragment), of
the named barriers and of the clusters against hardware. Mutants of the kernel file that
must fail: wgmma descriptors with a wrong swizzle, stride, leading byte offset or K step,
accumulators read
before their wgmma is waited for, a wgmma without its fence, the wgmma region left
unaligned, either cluster barrier removed, an off-by-one in the radix select, and, in
GATHER split's select across the cluster, a barrier or a wait removed, candidates pushed
without their keys or into the wrong slots.
Outputs start as -7 (neither an id nor the -1 padding), so a slot no kernel writes fails
the checker. Not covered here: speed, Hopper's fp8 accumulator precision (the emulation
sums in fp32), and the hardware's memory ordering.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from benchmarks.landscape_points import with_values
from benchmarks.topk_family_gpu import hand_choice
from evokernel.candidate import Candidate, ParamValue, load_candidate
from evokernel.evaluate.build import import_sources
from evokernel.evaluate.check import check_outputs
from evokernel.workload import Workload, load_workload
from tests.workloads import cuda_emulation

WORKLOAD = Path(__file__).resolve().parents[2] / "workloads" / "dsa_topk"
SEED = WORKLOAD / "seeds" / "cuda_family.yaml"
BANDS = ("MS", "ML", "LS", "LL")
UNWRITTEN = -7
"""What every output slot holds before a call."""

needs_gxx = pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on PATH")

# (batch, max_num_pages, seq_lens) reaching each path of the host; the scoring bands'
# rows are a few long ones (a page cut short, a row of 2049 tokens: one token to drop)
# among rows of at most 2048 tokens, which are written without scoring.
PATHS: dict[str, tuple[int, int, list[int]]] = {
    "PT": (3, 32, [2048, 1000, 1]),
    "MS": (3, 35, [2240, 2101, 700]),
    "ML": (17, 34, [2176, 2049, 2048, 1, *(64 * i + 5 for i in range(13))]),
    "LS": (2, 66, [4224, 2100]),
    "LL": (17, 65, [4157, 2300, 2048, 3, *(100 * i + 9 for i in range(13))]),
}


def _inputs_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dsa_topk_inputs_for_emulation", WORKLOAD / "inputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


INPUTS = _inputs_module()


@pytest.fixture(scope="module")
def wl() -> Workload:
    return load_workload("dsa_topk")


@pytest.fixture(scope="module")
def family() -> Candidate:
    """The hand choice (benchmarks/topk_family_gpu.py's HAND_CHOICE), the configuration
    whose one-parameter changes the H200 judged: every case below changes it."""
    return hand_choice(load_candidate(SEED, "dsa_topk"))


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the module's builds (a configuration built once is reused)."""
    return tmp_path_factory.mktemp("cuda_family_emulated")


def everywhere(values: dict[str, ParamValue]) -> dict[str, ParamValue]:
    """Band parameters (without their band prefix) given to all four bands."""
    return {f"{band}_{name}": value for band in BANDS for name, value in values.items()}


def configured(family: Candidate, values: dict[str, ParamValue]) -> Candidate:
    child = family.with_params(knobs={k: v for k, v in values.items() if k in family.knob_space},
                               launch={k: v for k, v in values.items() if k in family.launch_space},
                               operator="test")
    assert {k: child.params[k] for k in values} == values, "a configuration was repaired away"
    return child


def inputs_for(wl: Workload, path: str, seed: int) -> dict[str, torch.Tensor]:
    """The workload's own inputs at the path's shape, with its row lengths (reversed for
    even seeds, so a second call moves the long rows)."""
    batch, pages, lengths = PATHS[path]
    axes = {**wl.definition.const_axes(), "batch_size": batch, "max_num_pages": pages,
            "num_pages": batch * pages + 3}
    inputs: dict[str, torch.Tensor] = INPUTS.make_inputs(axes, seed, "cpu")
    inputs["seq_lens"] = torch.tensor(lengths[::-1] if seed % 2 == 0 else lengths, dtype=torch.int32)
    return inputs


def emulated(candidate: Candidate, directory: Path, source: str | None = None) -> Callable[..., None]:
    """The seed's host ``run`` over its kernels compiled for the CPU."""
    host = import_sources(candidate, directory)
    kernels = cuda_emulation.emulate(source or candidate.sources["cuda_family.cu"], candidate.params, directory)
    return host.build(dict(candidate.params), kernels)  # type: ignore[no-any-return]


def judge(wl: Workload, run: Callable[..., None], inputs: dict[str, torch.Tensor]) -> None:
    """One call into outputs holding UNWRITTEN; the contest's checker must pass."""
    batch = inputs["block_table"].shape[0]
    out = torch.full((batch, 2048), UNWRITTEN, dtype=torch.int32)
    run(*inputs.values(), out)
    expected = wl.expected_outputs(*inputs.values())
    verdict = check_outputs(wl, [out], list(expected), inputs)
    assert verdict.ok, verdict.message


def host_module(family: Candidate, directory: Path) -> ModuleType:
    return import_sources(family, directory)


# -- without g++: the kernel file's PTX and the translation unit -------------------------


def test_every_inline_ptx_of_the_kernel_file_is_in_a_guarded_helper() -> None:
    """Every ``asm`` of cuda_family.cu is under ``#ifndef EVOKERNEL_EMULATION`` (emu.h
    brings the emulated helpers) or in the phase timers of EVK_PHASES builds (a probe's
    switch the emulation never sets)."""
    stack: list[str] = []
    outside = []
    for number, line in enumerate((WORKLOAD / "seeds" / "cuda_family.cu").read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#if"):
            stack.append(stripped)
        elif stripped.startswith("#endif"):
            stack.pop()
        elif re.search(r"\basm\b", line.split("//")[0]) and not any(
            s == "#ifndef EVOKERNEL_EMULATION" or "EVK_PHASES" in s for s in stack
        ):
            outside.append((number, stripped))
    assert not outside, outside
    assert not stack


def test_the_translation_unit_registers_clusters_and_gives_each_block_its_shared_memory(
    family: Candidate,
) -> None:
    """In cluster mode each band kernel's cluster shape is registered (its launches then run
    a cluster's CTAs together); the file-scope dynamic shared memory becomes a per-thread
    pointer to the running block's, the select's static scratch the block's own."""
    c = configured(family, everywhere({"MODE": "cluster", "CTAS": 4}))
    unit, names = cuda_emulation.translation_unit(c.sources["cuda_family.cu"], c.params)
    assert set(names) == {"pt_topk", "ms_topk", "ml_topk", "ls_topk", "ll_topk"}
    for name in names[1:]:
        assert f"emu::declare_cluster(reinterpret_cast<const void*>(&{name}), emu::cluster_dims(" in unit
    assert "static thread_local u8* smem = static_cast<u8*>(emu::dynamic_shared());" in unit
    assert "auto& scratch = emu::block_static<SelectScratch, 0, 16>();" in unit
    assert "__shared__" not in re.sub(r"//[^\n]*", "", unit.split('#include "emu.h"', 1)[1])
    defined = 'extern "C" __global__ void __cluster_dims__(2, 1, 1) k(int* x) { x[0] = 1; }'
    with pytest.raises(ValueError, match="declaration of its own"):
        cuda_emulation.translation_unit(defined, {})


# -- the emulation's own conversions ---------------------------------------------------------


CONVERT = """
extern "C" __global__ void convert(const unsigned* in, unsigned* out, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = e4m3x2_to_f16x2(in[i]);
}
"""


@needs_gxx
def test_e4m3_pairs_convert_to_f16_exactly_low_byte_to_low_half(tmp_path: Path) -> None:
    """cvt.rn.f16x2.e4m3x2 as emulated, against torch's e4m3 -> f16 on all 256 codes
    (both NaN codes give NaN); byte 0 goes to the low half (cuda_fp8.hpp's host path of
    __nv_cvt_fp8x2_to_halfraw2)."""
    codes = torch.arange(256, dtype=torch.int64)
    packed = (codes | ((255 - codes) << 8)).to(torch.int32)
    out = torch.zeros(256, dtype=torch.int32)
    kernels = cuda_emulation.emulate(CONVERT, {}, tmp_path)
    kernels["convert"]((1,), (64,), packed, out, 256)
    halves = out.view(torch.int16).view(256, 2).view(torch.float16)
    for half, byte in ((halves[:, 0], codes), (halves[:, 1], 255 - codes)):
        want = byte.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
        assert torch.equal(half.isnan(), want.isnan())
        assert torch.equal(half[~want.isnan()], want[~want.isnan()])


# -- the seed's verdicts ---------------------------------------------------------------------


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("which", ["manifest", "hand_choice"])
def test_the_defaults_pass_on_every_path_call_after_call(wl: Workload, family: Candidate, builds: Path,
                                                         which: str) -> None:
    """pt_topk and the four band kernels with the manifest's defaults (the measured best)
    and with the hand choice, two input sets in a row through one runner: the second call
    runs on the arrival counters and histograms the first left, which the selecting CTA
    must have returned to zero."""
    run = emulated(load_candidate(SEED, "dsa_topk") if which == "manifest" else family, builds)
    for seed in (1, 2):
        for path in PATHS:
            judge(wl, run, inputs_for(wl, path, seed))


def one_parameter_changes(family: Candidate) -> list[tuple[str, Candidate, str]]:
    """(label, configuration, path) for every one-parameter change the GPU run judged (the
    entries of benchmarks/topk_family_gpu.py's family_configurations after the defaults and
    before its draws: a band parameter's value in all four bands at once, repaired to a
    valid configuration, or a PT parameter's), each run on one band it changes, the bands
    taken in turn."""
    out: list[tuple[str, Candidate, str]] = []
    seen = {family.id}
    names = sorted({n.split("_", 1)[1] for n in family.space if n.split("_", 1)[0] in BANDS})
    for name in names:
        for value in family.space[f"MS_{name}"].choices:
            c = with_values(family, everywhere({name: value}), "structural")
            changed = [b for b in BANDS if any(c.params[k] != v for k, v in family.params.items()
                                               if k.startswith(f"{b}_"))]
            if c.id not in seen:
                out.append((f"all:{name}={value}", c, changed[len(out) % len(changed)]))
                seen.add(c.id)
    for name in sorted(n for n in family.space if n.startswith("PT_")):
        for value in family.space[name].choices:
            c = with_values(family, {name: value}, "structural")
            if c.id not in seen:
                out.append((f"{name}={value}", c, "PT"))
                seen.add(c.id)
    return out


_SEED_FAMILY = hand_choice(load_candidate(SEED, "dsa_topk"))
ONE_PARAMETER = one_parameter_changes(_SEED_FAMILY)


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize(("label", "candidate", "path"), ONE_PARAMETER,
                         ids=[f"{label}@{path}" for label, _, path in ONE_PARAMETER])
def test_every_one_parameter_change_passes(wl: Workload, builds: Path, label: str, candidate: Candidate,
                                           path: str) -> None:
    run = emulated(candidate, builds)
    judge(wl, run, inputs_for(wl, path, 1))


COMBINATIONS: list[dict[str, ParamValue]] = [
    {"SCORE": "wgmma", "SWIZZLE": 0, "SLICES": 1, "EARLY": 1},
    {"SCORE": "wgmma", "WARPS": 8, "STAGES": 4, "SWIZZLE": 0, "SLICES": 4},  # warpgroups 0 and 1
    {"SCORE": "wgmma", "WARPS": 16, "STAGES": 3, "EARLY": 1, "SLICES": 4, "HIST": "score", "RADIX_BITS": 12},
    {"SCORE": "wgmma", "MODE": "cluster", "CTAS": 4, "WARPS": 16, "STAGES": 3, "SWIZZLE": 0, "EARLY": 1},
    {"SCORE": "wgmma", "MODE": "two_pass", "SELECT": "bitonic", "SWIZZLE": 0, "SLICES": 1, "STAGES": 1},
    {"MODE": "cluster", "CTAS": 8, "HIST": "score", "RADIX_BITS": 8, "SHORT": "first_cta"},
    {"MODE": "cluster", "CTAS": 2, "SELECT": "bitonic", "SCORE": "f16", "LOAD": "bulk", "SWIZZLE": 0, "STAGES": 3},
    {"MODE": "cluster", "CTAS": 1, "SHORT": "first_cta", "SCORE": "simt"},  # a cluster of one CTA
    {"MODE": "two_pass", "SCORE": "simt", "LOAD": "ldg", "SWIZZLE": 0, "STAGES": 1, "CTAS": 16,
     "HIST": "score", "RADIX_BITS": 10},
    {"SCORE": "f16", "LOAD": "ldg", "SWIZZLE": 0, "WARPS": 16, "CTAS": 2},
    {"LOAD": "bulk", "SWIZZLE": 0, "STAGES": 4, "WARPS": 2, "CTAS": 1, "SHORT": "first_cta", "SELECT": "bitonic"},
    # GATHER split: the select across the cluster (HIST select, then score: counted while scoring)
    {"MODE": "cluster", "CTAS": 8, "GATHER": "split", "RADIX_BITS": 8},
    {"MODE": "cluster", "CTAS": 2, "GATHER": "split", "HIST": "score", "RADIX_BITS": 12, "SCORE": "simt"},
    {"SCORE": "wgmma", "MODE": "cluster", "CTAS": 4, "WARPS": 16, "EARLY": 1, "GATHER": "split", "HIST": "score"},
    # DIGIT span (the first digit linear in the score) and COMPACT scan (slots by a prefix sum)
    {"DIGIT": "span", "COMPACT": "scan", "HANDOFF": "acq_rel"},
    {"DIGIT": "span", "COMPACT": "scan", "SCORE": "wgmma", "MODE": "cluster", "CTAS": 4, "WARPS": 16, "EARLY": 1},
    {"DIGIT": "span", "MODE": "two_pass", "RADIX_BITS": 8, "WARPS": 2},
    {"COMPACT": "scan", "MODE": "cluster", "CTAS": 4, "GATHER": "split", "RADIX_BITS": 10},
    # COMPACT registers: keys in the selecting CTA's registers; span (a few candidates,
    # ranked) and top digits with 8-bit bins (many candidates: radix_refine's passes)
    {"COMPACT": "registers", "DIGIT": "span", "HANDOFF": "acq_rel", "WARPS": 16},
    {"COMPACT": "registers", "MODE": "two_pass", "DIGIT": "top", "RADIX_BITS": 8, "WARPS": 8},
    {"COMPACT": "registers", "DIGIT": "span", "SCORE": "f16", "WARPS": 8, "CTAS": 2},
    # the manifest's defaults (COMPACT registers is one since 2026-12-07), one CTA a row,
    # and two passes with the span digit
    {"COMPACT": "registers", "SCORE": "wgmma", "EARLY": 1, "WARPS": 16, "DIGIT": "span", "HANDOFF": "acq_rel",
     "CTAS": 16, "SHORT": "all_ctas"},
    {"COMPACT": "registers", "CTAS": 1, "SHORT": "first_cta", "WARPS": 8},
    {"COMPACT": "registers", "MODE": "two_pass", "DIGIT": "span", "WARPS": 16},
]


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("values", COMBINATIONS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_combinations_pass(wl: Workload, family: Candidate, builds: Path, values: dict[str, ParamValue]) -> None:
    """Each on band MS and on one other band, the others taken in turn."""
    run = emulated(configured(family, everywhere(values)), builds)
    for band in ("MS", BANDS[1 + COMBINATIONS.index(values) % 3]):
        judge(wl, run, inputs_for(wl, band, 3))


# -- mutants ---------------------------------------------------------------------------------


def mutant(family: Candidate, values: dict[str, ParamValue], old: str, new: str,
           directory: Path) -> Callable[..., None]:
    candidate = configured(family, everywhere(values))
    source = candidate.sources["cuda_family.cu"]
    assert source.count(old) == 1, old
    return emulated(candidate, directory, source.replace(old, new))


WAITED = """                wgmma_wait_all();
#pragma unroll
                for (int u = 0; u < B::slices; ++u) wgmma_hold(d[u]);
#pragma unroll
                for (int x = 0; x < 16; ++x) {
                    float sum = d[0][x];
#pragma unroll
                    for (int u = 1; u < B::slices; ++u) sum += d[u][x];
                    acc[x] = k0 == 0 ? sum : acc[x] + sum;
                }
"""
READ_EARLY = WAITED.split("\n", 1)[1] + "                wgmma_wait_all();\n"

SPLIT: dict[str, ParamValue] = {"MODE": "cluster", "CTAS": 4, "GATHER": "split"}

WRONG_RESULTS: dict[str, tuple[dict[str, ParamValue], str, str]] = {
    "swizzle mode 0 in a 128-byte-swizzle descriptor": (
        {"SCORE": "wgmma"}, "((u64)(SWIZZLE128 ? 1u : 0u) << 62)", "((u64)(SWIZZLE128 ? 0u : 0u) << 62)"),
    "stride byte offset 512 (no swizzle)": (
        {"SCORE": "wgmma", "SWIZZLE": 0}, "const u64 sbo = 1024u >> 4;", "const u64 sbo = 512u >> 4;"),
    "stride byte offset 512 (128-byte swizzle)": (
        {"SCORE": "wgmma"}, "const u64 sbo = 1024u >> 4;", "const u64 sbo = 512u >> 4;"),
    "leading byte offset 256 (no swizzle)": (
        {"SCORE": "wgmma", "SWIZZLE": 0}, "SWIZZLE128 ? 1u : 128u >> 4", "SWIZZLE128 ? 1u : 256u >> 4"),
    "K step of one core matrix (no swizzle)": (
        {"SCORE": "wgmma", "SWIZZLE": 0}, "SWIZZLE128 ? 32u >> 4 : 256u >> 4", "SWIZZLE128 ? 32u >> 4 : 128u >> 4"),
    "accumulators read before their wait": (
        {"SCORE": "wgmma", "SLICES": 1}, WAITED, READ_EARLY),
    "first cluster barrier removed (keys gathered before they are written)": (
        {"MODE": "cluster"}, "cluster_sync();  // every CTA of the row has its keys", "// every CTA of the row has its keys"),
    "radix select: equal keys written one slot early": (
        {}, "const u32 first_eq = (u32)topk - krem;", "const u32 first_eq = (u32)topk - krem - 1u;"),
    "split: barrier A removed (the leader reads its histogram before every count lands)": (
        SPLIT, "    cluster_sync();  // (A)", "    // (A)"),
    "split: barrier B removed (CTAs read the bin before the leader stores it)": (
        SPLIT, "    cluster_sync();  // (B)", "    // (B)"),
    "split: candidates pushed without their keys": (
        SPLIT, "if (cta != 0) dsmem_store(keys + i, 0u, k);", ""),
    "split: candidates pushed at the CTA's own slots, not its range of the leader's": (
        SPLIT, "cand + first_cand + pc", "cand + pc"),
    "split: ids above the bin written at the CTA's own slots, not its range of out": (
        SPLIT, "out[first_gt + pg]", "out[pg]"),
    "span: a candidate counted among those ranked above itself": (
        {"DIGIT": "span"}, "((ki == kj) & (i < j))", "((ki == kj) & (i <= j))"),
    "scan: a lane's slot counts the lane itself": (
        {"COMPACT": "scan"}, "const u32 below = (1u << lane) - 1u;", "const u32 below = (2u << lane) - 1u;"),
    "registers: a warp's winners of every key step written to the same slots": (
        {"COMPACT": "registers", "WARPS": 8},
        "at1 += (u32)__popc(v1);\n        at2 += (u32)__popc(v2);\n    }\n    __syncthreads();  // candidates",
        "at2 += (u32)__popc(v2);\n    }\n    __syncthreads();  // candidates"),
    "registers: the candidates' counts left out of the prefix sum": (
        {"COMPACT": "registers", "WARPS": 8}, "u32 counts = ((u32)__popc(above) << 16) | (u32)__popc(in_bin);",
        "u32 counts = (u32)__popc(above) << 16;"),
}


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("name", list(WRONG_RESULTS))
def test_a_wrong_kernel_fails_the_checker(wl: Workload, family: Candidate, builds: Path, name: str) -> None:
    values, old, new = WRONG_RESULTS[name]
    run = mutant(family, values, old, new, builds)
    with pytest.raises(AssertionError):
        judge(wl, run, inputs_for(wl, "MS", 1))


FAULTS: dict[str, tuple[dict[str, ParamValue], str, str, str]] = {
    "split: barrier C removed (candidates pushed, never released)": (
        SPLIT, "    cluster_sync();  // (C)", "    // (C)", "no cluster barrier released"),
    "split: the leader's zeroed histogram not waited for": (
        SPLIT, "        cluster_wait();   // (0): the leader's histogram is zeroed\n", "",
        "between barrier.cluster.arrive and its wait"),
    "wgmma without its fence": (
        {"SCORE": "wgmma"}, "                wgmma_fence();\n", "", "without a wgmma.fence"),
    "wgmma region not 1 KiB aligned (128-byte swizzle)": (
        {"SCORE": "wgmma"},
        "return smem + L.stage + ((WG_ALIGN - (at & (WG_ALIGN - 1))) & (WG_ALIGN - 1));",
        "return smem + L.stage;", "1 KiB boundary"),
    "second cluster barrier removed (CTAs exit while the leader reads them)": (
        {"MODE": "cluster"}, "cluster_sync();  // the leader has read", "// the leader has read", "exited"),
}


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAULTS))
def test_a_wrong_kernel_faults(wl: Workload, family: Candidate, builds: Path, name: str) -> None:
    values, old, new, why = FAULTS[name]
    run = mutant(family, values, old, new, builds)
    with pytest.raises(cuda_emulation.EmulationFault, match=why):
        judge(wl, run, inputs_for(wl, "MS", 1))


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("compact", ["atomic", "scan", "registers"])
def test_span_selects_rows_whose_scores_do_not_spread(wl: Workload, family: Candidate, builds: Path,
                                                       compact: str) -> None:
    """DIGIT span on rows it cannot spread over the bins: every score of a row equal (its
    weights zero: the extremes are equal, so every key is in bin 0 and the candidates, more
    than a CTA's threads, are refined by the key's digits from the top), or so close that
    the digit's scale is not finite (weights of 1e-41: scores within 3.6e-39 of each other,
    2048 bins over them overflow a float). The third row is short."""
    values: dict[str, ParamValue] = {"DIGIT": "span", "COMPACT": compact}
    if compact == "registers":
        values["WARPS"] = 8  # its keys in registers: 8+ warps
    run = emulated(configured(family, everywhere(values)), builds)
    inputs = inputs_for(wl, "MS", 1)
    inputs["weights"][0] = 0.0
    inputs["weights"][1] *= 1e-41
    judge(wl, run, inputs)


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("values", [{"WARPS": 8}, {"WARPS": 8, "DIGIT": "span"}, {"WARPS": 16, "DIGIT": "span"}],
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_registers_select_the_widest_rows(wl: Workload, family: Candidate, builds: Path,
                                          values: dict[str, ParamValue]) -> None:
    """COMPACT registers on rows of 128 pages, the widest a band takes (band LS): 8192 and
    8191 keys fill every register a thread holds and give the packed prefix sum its
    largest counts; the third row's scores are all equal (8191 candidates)."""
    run = emulated(configured(family, everywhere({"COMPACT": "registers", **values})), builds)
    axes = {**wl.definition.const_axes(), "batch_size": 3, "max_num_pages": 128, "num_pages": 3 * 128 + 3}
    inputs: dict[str, torch.Tensor] = INPUTS.make_inputs(axes, 5, "cpu")
    inputs["seq_lens"] = torch.tensor([8192, 8191, 8191], dtype=torch.int32)
    inputs["weights"][2] = 0.0
    judge(wl, run, inputs)


@needs_gxx
@pytest.mark.slow
def test_the_unmutated_sources_pass_where_the_mutants_run(wl: Workload, family: Candidate, builds: Path) -> None:
    """The configurations the mutants change, unchanged, pass the same inputs (so what
    the mutant tests see is the mutation)."""
    unmutated: list[dict[str, ParamValue]] = [
        {"SCORE": "wgmma"}, {"SCORE": "wgmma", "SWIZZLE": 0}, {"SCORE": "wgmma", "SLICES": 1}, {"MODE": "cluster"},
        SPLIT, {"DIGIT": "span"}, {"COMPACT": "scan"}, {"COMPACT": "registers", "WARPS": 8}]
    for values in unmutated:
        judge(wl, emulated(configured(family, everywhere(values)), builds), inputs_for(wl, "MS", 1))


def test_the_paths_reach_the_bands_they_are_named_for(family: Candidate, tmp_path: Path) -> None:
    host = host_module(family, tmp_path)
    for path, (batch, pages, lengths) in PATHS.items():
        assert host.band_of(batch, pages, 2048) == path
        assert len(lengths) == batch and max(lengths) <= pages * 64
        assert (max(lengths) > 2048) == (path != "PT")
