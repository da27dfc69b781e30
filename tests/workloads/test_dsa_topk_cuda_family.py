"""The cuda_family seed of dsa_topk: its space, its constraints, its host code and its builds.

Running the kernels needs a GPU (benchmarks/topk_family_gpu.py does that through the
judge) or the CPU emulation (test_dsa_topk_cuda_family_emulated.py); here the space is counted, the declared shared-memory bound is compared with
the host's layout and with the kernel's own (compiled as host code by nvcc), the host's
launches are recorded against fake kernels, and configurations are compiled for sm_90a
with NVRTC: the defaults, every value of every parameter, and a fixed sample.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.probe_kernels import PHASE_BUFFER, PHASE_DEFINE, with_define
from benchmarks.topk_family_gpu import family_configurations, hand_choice
from evokernel import constraints as rules
from evokernel.candidate import Candidate, ParamValue, load_candidate
from evokernel.evaluate.build import cuda_source, kernel_names, nvrtc_cubin
from evokernel.operators.base import OperatorContext
from evokernel.operators.knobs import KnobCrossover, KnobMutation
from evokernel.workload import load_workload

SEEDS = Path(__file__).resolve().parents[2] / "workloads" / "dsa_topk" / "seeds"
KERNELS = {"pt_topk", "ms_topk", "ml_topk", "ls_topk", "ll_topk"}
SAMPLE = 200


def _import_host() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_family_host", SEEDS / "cuda_family_host.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


host = _import_host()


@pytest.fixture(scope="module")
def family() -> Candidate:
    return load_candidate(SEEDS / "cuda_family.yaml", "dsa_topk")


@pytest.fixture(scope="module")
def hand(family: Candidate) -> Candidate:
    """The defaults as chosen before any measurement: the base the knob-by-knob tests
    below change one thing of (the manifest's defaults are the measured best since)."""
    return hand_choice(family)


def declared(c: Candidate) -> list[rules.Constraint]:
    return rules.check_declared(c.constraints, c.space)


def band_space(c: Candidate, band: str) -> dict[str, Any]:
    return {n: p for n, p in c.space.items() if n.startswith(f"{band}_")}


def with_values(c: Candidate, values: dict[str, ParamValue]) -> Candidate:
    return c.with_params(knobs={k: v for k, v in values.items() if k in c.knob_space},
                         launch={k: v for k, v in values.items() if k in c.launch_space},
                         operator="test")


# -- the space ------------------------------------------------------------------------


def test_the_kernels_widest_rows_are_the_hosts(family: Candidate) -> None:
    """Each band kernel is built for the widest row the host sends it (COMPACT registers
    sizes its per-thread key arrays by it)."""
    source = family.sources["cuda_family.cu"]
    widths = dict(re.findall(r"^#define (MID_ROW_PAGES|MAX_ROW_PAGES) (\d+)", source, re.M))
    pages = {"MID_ROW_PAGES": int(widths["MID_ROW_PAGES"]), "MAX_ROW_PAGES": int(widths["MAX_ROW_PAGES"])}
    built = dict(re.findall(r"band_kernel<Widest<Band(\w\w), (\w+)>>", source))
    assert {band: pages[built[band]] for band in host.BANDS} == host.BAND_MAX_PAGES
    assert pages["MAX_ROW_PAGES"] == host.LONG_MAX_PAGES


def test_the_space_holds_enough_distinct_valid_configurations(family: Candidate) -> None:
    constraints = declared(family)
    assert not rules.violated(constraints, family.params), "the defaults are valid"
    total = rules.count_valid(family.space, constraints)
    assert total >= 10**4
    for band in host.BANDS:  # every band on its own is a space worth searching
        space = band_space(family, band)
        assert rules.count_valid(space, [c for c in constraints if c.names <= set(space)]) >= 10**4
    # constraints link parameters of one band only: bands are searched independently
    for c in constraints:
        assert len({n.split("_")[0] for n in c.names}) == 1, c.text


def test_every_value_of_every_parameter_is_in_some_valid_configuration(family: Candidate) -> None:
    constraints = declared(family)
    for band in host.BANDS:
        space = band_space(family, band)
        names, allowed = rules.valid_combinations(space, [c for c in constraints if c.names <= set(space)])
        seen = {name: {combo[i] for combo in allowed} for i, name in enumerate(names)}
        for name, param in space.items():
            assert seen[name] == set(param.choices), name


# From the defaults (wgmma scoring, which needs cp.async; 16 CTAs a row in bands MS and LS,
# more than a portable cluster) one request cannot reach these: the repair would have to
# change three or more other parameters. One step away, each is a single request.
ONE_STEP_AWAY = {
    ("MS_LOAD", "bulk"): ("MS_SCORE", "fp8"), ("ML_LOAD", "bulk"): ("ML_SCORE", "fp8"),
    ("LS_LOAD", "bulk"): ("LS_SCORE", "fp8"), ("LL_LOAD", "bulk"): ("LL_SCORE", "fp8"),
    ("MS_GATHER", "split"): ("MS_MODE", "cluster"), ("LS_GATHER", "split"): ("LS_MODE", "cluster"),
    # COMPACT registers (the default) rules out cluster mode, which a split gather needs
    ("ML_GATHER", "split"): ("ML_MODE", "cluster"), ("LL_GATHER", "split"): ("LL_MODE", "cluster"),
}


def test_a_request_for_one_value_reaches_it_from_the_defaults(family: Candidate) -> None:
    constraints = declared(family)
    for name, param in family.space.items():
        for value in param.choices:
            start = family
            if (name, value) in ONE_STEP_AWAY:
                start = family.with_params(**_as_request(family, *ONE_STEP_AWAY[name, value]), operator="test")
                unrepaired = family.with_params(**_as_request(family, name, value), operator="test")
                assert unrepaired.params[name] != value, f"{name}={value} is one request away now: drop it"
            child = start.with_params(**_as_request(start, name, value), operator="test")
            assert child.params[name] == value, (name, value)
            assert not rules.violated(constraints, child.params)


def _as_request(c: Candidate, name: str, value: ParamValue) -> dict[str, dict[str, ParamValue]]:
    return {"knobs": {name: value}} if name in c.knob_space else {"launch": {name: value}}


def test_search_operators_only_make_valid_configurations(family: Candidate) -> None:
    constraints = declared(family)
    mutate = KnobMutation(max_changes=3, spaces=("knobs", "launch"))
    cross = KnobCrossover(spaces=("knobs", "launch"))
    population = [family]
    for step in range(150):
        ctx = OperatorContext(rng=np.random.default_rng(step), workload="dsa_topk", budget_left=10)
        parent = population[int(ctx.rng.integers(len(population)))]
        children = mutate.propose([parent], ctx)
        if len(population) > 1:
            children += cross.propose([parent, population[int(ctx.rng.integers(len(population)))]], ctx)
        for child in children:
            assert not rules.violated(constraints, child.params)
        population += children
    assert len({c.id for c in population}) > 100


def test_the_declared_shared_memory_bound_is_the_hosts_layout(family: Candidate) -> None:
    """For every band configuration that the other constraints allow, the manifest's
    shared-memory constraint holds exactly when the host's layout of the band's widest
    rows fits (so neither refuses what the other launches)."""
    constraints = declared(family)
    for band in host.BANDS:
        space = band_space(family, band)
        mine = [c for c in constraints if c.names <= set(space)]
        (smem_rule,) = [c for c in mine if "8448" in c.text]
        others = [c for c in mine if c is not smem_rule]
        names, allowed = rules.valid_combinations(space, others)
        checked = 0
        for combo in allowed:
            values = dict(zip(names, combo, strict=True))
            cfg = host.BandConfig.of(values, band)
            fits = host.smem_layout(cfg, host.BAND_MAX_PAGES[band])["total"] <= host.SMEM_LIMIT
            assert smem_rule.holds(values) == fits, values
            checked += 1
        assert checked > 10**4


# -- bands and launches ---------------------------------------------------------------


def test_every_contest_shape_falls_in_a_band_and_quick_covers_all_five() -> None:
    wl = load_workload("dsa_topk")
    bands = {}
    for uuid, shape in wl.shapes.items():
        batch, pages = shape.axes["batch_size"], shape.axes["max_num_pages"]
        bands[uuid] = host.band_of(batch, pages, 2048)
        assert (bands[uuid] == "PT") == (pages <= 32)
    assert {bands[s] for s in wl.subsets["quick"]} == {"PT", *host.BANDS}
    with pytest.raises(ValueError, match="outside the cuda_family range"):
        host.band_of(4, host.LONG_MAX_PAGES + 1, 2048)


class RecordedKernels:
    """Stands in for CudaKernels: records each launch instead of running it."""

    def __init__(self) -> None:
        self.launches: list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[Any, ...], int]] = []

    def __getitem__(self, name: str) -> Any:
        def launch(grid: tuple[int, ...], block: tuple[int, ...], *args: Any, shared_mem: int = 0) -> None:
            self.launches.append((name, grid, block, args, shared_mem))

        return launch


def _inputs(batch: int, pages: int) -> list[torch.Tensor]:
    return [torch.zeros(batch, 64, 128, dtype=torch.float8_e4m3fn),
            torch.zeros(200, 64, 1, 132, dtype=torch.int8), torch.zeros(batch, 64),
            torch.full((batch,), pages * 64, dtype=torch.int32),
            torch.zeros(batch, pages, dtype=torch.int32), torch.zeros(batch, 2048, dtype=torch.int32)]


@pytest.mark.parametrize(("batch", "pages", "kernel"),
                         [(4, 32, "pt_topk"), (4, 34, "ms_topk"), (30, 36, "ml_topk"),
                          (12, 82, "ls_topk"), (30, 91, "ll_topk")])
@pytest.mark.parametrize("mode", ["fused", "cluster", "two_pass"])
def test_the_host_launches_its_bands_kernel(hand: Candidate, batch: int, pages: int, kernel: str,
                                            mode: str) -> None:
    band = kernel[:2].upper()
    c = hand if kernel == "pt_topk" else with_values(hand, {f"{band}_MODE": mode})
    recorded = RecordedKernels()
    run = host.build(dict(c.params), recorded)
    inputs = _inputs(batch, pages)
    run(*inputs)
    run(*inputs)  # the workspace is kept, not made again
    launches = recorded.launches[: len(recorded.launches) // 2]
    if kernel == "pt_topk":
        (only,) = launches
        assert only[0] == "pt_topk" and only[1] == (batch, 1, 1)
        assert only[2] == (c.params["PT_THREADS"], 1, 1)
        assert only[3][2] is inputs[5] and only[3][3:] == (pages, 2048)
        return
    cfg = host.BandConfig.of(c.params, band)
    phases = [0, 1] if cfg.mode == "two_pass" else [0]
    assert [launch[0] for launch in launches] == [kernel] * len(phases)
    smem = host.smem_layout(cfg, pages)["total"]
    for (_, grid, block, args, shared), phase in zip(launches, phases, strict=True):
        assert grid == ((cfg.ctas if phase == 0 else 1), batch, 1)
        assert block == (cfg.threads, 1, 1) and shared == smem <= host.SMEM_LIMIT
        assert all(a is b for a, b in zip(args[:6], inputs, strict=True))
        keys, hist, counters = args[6:9]
        assert keys.numel() == batch * pages * 64 and keys.dtype == torch.int32
        assert hist.numel() >= batch * host.HIST_STRIDE and counters.numel() >= batch
        assert not hist.any() and not counters.any()
        assert args[9:] == (pages, 2048, phase)
    assert recorded.launches[-1][3][7] is launches[-1][3][7], "the same workspace next call"


# -- builds ---------------------------------------------------------------------------


def _has_nvrtc() -> bool:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:
        return False
    return True


def _compile(c: Candidate) -> None:
    source = cuda_source(c)
    assert set(kernel_names(source)) == KERNELS
    cubin, _ = nvrtc_cubin(source, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    for name in KERNELS:
        assert name.encode() in cubin, f"{name} is missing from the cubin"


def configurations_to_build(c: Candidate) -> list[Candidate]:
    """What benchmarks/topk_family_gpu.py evaluates on the GPU, in its order."""
    return [candidate for _, candidate in family_configurations(c, SAMPLE)]


def test_the_build_list_covers_every_value_of_every_parameter(family: Candidate) -> None:
    built = configurations_to_build(family)
    assert len({c.id for c in built}) == len(built) >= SAMPLE
    assert built[0] == family
    for name, param in family.space.items():
        assert {c.params[name] for c in built} == set(param.choices), name


@pytest.mark.slow
@pytest.mark.timeout(1800)  # every configuration of the build list, one NVRTC compile each: minutes
@pytest.mark.skipif(not _has_nvrtc(), reason="CuPy's NVRTC is not installed")
def test_every_configuration_to_build_compiles_for_sm90a_with_nvrtc(family: Candidate) -> None:
    def failure(c: Candidate) -> str | None:
        try:
            _compile(c)
        except Exception as exc:  # collect them all: one report names every bad combination
            changed = {k: v for k, v in c.params.items() if v != family.params[k]}
            return f"{changed}: {str(exc)[:400]}"
        return None

    # NVRTC lets go of the interpreter while it compiles: one thread a core
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        failures = [f for f in pool.map(failure, configurations_to_build(family)) if f]
    assert not failures, "\n".join(failures[:10])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_kernels_layout_is_the_hosts(hand: Candidate, tmp_path: Path) -> None:
    """make_layout in cuda_family.cu, compiled as host code, against smem_layout."""
    constraints = declared(hand)
    space = band_space(hand, "MS")
    draws = rules.sample_valid(space, [c for c in constraints if c.names <= set(space)],
                               np.random.default_rng(7), 60)
    for case in SPLIT_CASES[:3]:  # GATHER split's region, whatever the draws hold
        draws.append({k: v for k, v in split_everywhere(hand, case).params.items() if k in space})
    ids = {"fused": 0, "cluster": 1, "two_pass": 2, "fp8": 0, "f16": 1, "simt": 2, "wgmma": 3, "ldg": 0,
           "cp_async": 1, "bulk": 2, "radix": 0, "bitonic": 1, "select": 0, "score": 1,
           "first_cta": 0, "all_ctas": 1, "leader": 0, "split": 1, "top": 0, "span": 1, "atomic": 0, "scan": 1, "registers": 2,
           "fence": 0, "acq_rel": 1}
    cases = []
    lines = []
    for i, values in enumerate(draws):
        cfg = host.BandConfig.of(values, "MS")
        pages = (33, 45, 64, 91, 128)[i % 5]
        cases.append((cfg, pages))
        args = ", ".join(str(x) for x in (
            ids[cfg.mode], ids[cfg.score], ids[cfg.load], cfg.stages, cfg.swizzle, ids[cfg.select],
            cfg.radix_bits, ids[cfg.hist], ids[cfg.short], cfg.early, cfg.slices, ids[cfg.gather],
            ids[cfg.digit], ids[cfg.compact], ids[cfg.handoff], cfg.ctas, cfg.warps))
        lines.append(f"  show(make_layout<Band<{args}>>({pages}));")
    program = cuda_source(hand) + """
#include <cstdio>
static void show(const Layout& L) {
  std::printf("%d %d %d %d %d %d %d %d %d %d\\n", L.stage, L.bars, L.qt, L.hist, L.keys, L.sorted,
              L.cand, L.bts, L.xchg, L.total);
}
int main() {
""" + "\n".join(lines) + "\n  return 0;\n}\n"
    src = tmp_path / "layout.cu"
    src.write_text(program)
    exe = tmp_path / "layout"
    subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", "-o", str(exe), str(src)],
                   check=True, capture_output=True, text=True, timeout=600)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60)
    order = ["stage", "bars", "qt", "hist", "keys", "sorted", "cand", "bts", "xchg", "total"]
    for (cfg, pages), line in zip(cases, printed.stdout.splitlines(), strict=True):
        layout = host.smem_layout(cfg, pages)
        assert [int(x) for x in line.split()] == [layout[k] for k in order], (cfg, pages)


# -- the wgmma scoring path -----------------------------------------------------------

WGMMA_CASES: list[dict[str, ParamValue]] = [
    {},  # 128-byte swizzle, 4 warps (one warpgroup), 2 stages
    {"SWIZZLE": 0},  # unswizzled core matrices
    {"WARPS": 16, "STAGES": 1},
    {"WARPS": 8, "STAGES": 4, "SWIZZLE": 0},
    {"WARPS": 16, "STAGES": 3, "HIST": "score", "RADIX_BITS": 12},
    {"MODE": "cluster", "CTAS": 8, "WARPS": 8},
    {"MODE": "two_pass", "SELECT": "bitonic", "SWIZZLE": 0},
    {"CTAS": 1, "SHORT": "first_cta", "WARPS": 16, "STAGES": 2},
    {"EARLY": 1},  # the row's loads issued together (wg_early_loads)
    {"EARLY": 1, "WARPS": 16, "STAGES": 3, "SWIZZLE": 0, "MODE": "cluster", "CTAS": 4},
    {"EARLY": 1, "WARPS": 16, "MODE": "cluster", "CTAS": 4, "GATHER": "split"},  # split_select
]


def wgmma_everywhere(c: Candidate, case: dict[str, ParamValue]) -> Candidate:
    values = {f"{band}_{name}": value for band in host.BANDS
              for name, value in {"SCORE": "wgmma", **case}.items()}
    child = with_values(c, values)
    assert {k: child.params[k] for k in values} == values, "a wgmma case was repaired away"
    return child


def test_wgmma_needs_warpgroups_and_cp_async(hand: Candidate) -> None:
    constraints = declared(hand)
    for band in host.BANDS:
        ok = {**hand.params, f"{band}_SCORE": "wgmma"}
        assert not rules.violated(constraints, ok)
        for bad in ({f"{band}_WARPS": 2}, {f"{band}_LOAD": "ldg"}, {f"{band}_LOAD": "bulk"}):
            assert rules.violated(constraints, {**ok, **bad, f"{band}_SWIZZLE": 0}), bad
    cfg = host.BandConfig.of({**hand.params, "MS_SCORE": "wgmma", "MS_WARPS": 8, "MS_STAGES": 3}, "MS")
    layout = host.smem_layout(cfg, 64)
    assert layout["hist"] - layout["stage"] == 1024 + 8192 + 2 * 3 * 9216


def test_early_loads_are_wgmmas_and_change_no_layout(hand: Candidate) -> None:
    constraints = declared(hand)
    assert all(hand.params[f"{band}_EARLY"] == 0 for band in host.BANDS)
    for band in host.BANDS:
        wg = {**hand.params, f"{band}_SCORE": "wgmma"}
        assert not rules.violated(constraints, {**wg, f"{band}_EARLY": 1})
        for score in ("fp8", "f16", "simt"):
            assert rules.violated(constraints, {**wg, f"{band}_SCORE": score, f"{band}_EARLY": 1}), score
        # the search proposes it only where it is valid: a request for EARLY repairs SCORE
        child = with_values(hand, {f"{band}_EARLY": 1})
        assert child.params[f"{band}_EARLY"] == 1 and child.params[f"{band}_SCORE"] == "wgmma"
        for warps, stages in itertools.product((4, 8, 16), (1, 2, 3, 4)):
            values = {**wg, f"{band}_WARPS": warps, f"{band}_STAGES": stages}
            late, early = (host.BandConfig.of({**values, f"{band}_EARLY": e}, band) for e in (0, 1))
            assert early.early == 1 and late.early == 0
            pages = host.BAND_MAX_PAGES[band]
            assert host.smem_layout(early, pages) == host.smem_layout(late, pages)


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvrtc(), reason="CuPy's NVRTC is not installed")
def test_the_wgmma_path_compiles_for_sm90a_in_every_band(hand: Candidate) -> None:
    for case in WGMMA_CASES:
        _compile(wgmma_everywhere(hand, case))


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("case", [WGMMA_CASES[0], WGMMA_CASES[1], WGMMA_CASES[2], WGMMA_CASES[-1]])
def test_ptxas_keeps_the_wgmma_kernels_in_registers(hand: Candidate, tmp_path: Path,
                                                    case: dict[str, ParamValue]) -> None:
    """The defaults with wgmma scoring in every band: no spills, and no wgmma that ptxas
    had to serialise (the last case: the best measured shape, 16 warps and EARLY, in a
    cluster of 4 with GATHER split)."""
    src = tmp_path / "kernel.cu"
    src.write_text(cuda_source(wgmma_everywhere(hand, case)))
    proc = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", "-cubin", "-Xptxas", "-v",
                           "-o", str(tmp_path / "kernel.cubin"), str(src)],
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "serializ" not in log, log
    entries = _ENTRY.findall(log)
    assert set(entries) == KERNELS
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    assert len(spills) == len(KERNELS) and not any(spills), log


EARLY_CASES: list[dict[str, ParamValue]] = [
    *({"EARLY": 1, "WARPS": w, "STAGES": s} for w in (4, 8, 16) for s in (1, 2, 3, 4)),  # fused
    {"EARLY": 1, "MODE": "cluster", "CTAS": 8, "WARPS": 8, "STAGES": 2},
    {"EARLY": 1, "MODE": "two_pass", "SELECT": "bitonic", "SWIZZLE": 0, "WARPS": 16},
]


def _early_build(source: str, where: Path) -> tuple[str, str]:
    """PTX and the ptxas -v log of the source for sm_90a (nvcc)."""
    (where / "kernel.cu").write_text(source)
    logs = []
    for out, extra in (("ptx", []), ("cubin", ["-Xptxas", "-v"])):
        proc = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", f"-{out}", *extra, "-o",
                               str(where / f"kernel.{out}"), str(where / "kernel.cu")],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        logs.append(proc.stdout + proc.stderr)
    return (where / "kernel.ptx").read_text(), logs[1]


def _built_without_spills(cases: list[Candidate], where: Path) -> list[tuple[Candidate, dict[str, str], str]]:
    """Each case built by nvcc for sm_90a (four at a time), checked to serialise no wgmma
    and spill nothing in any kernel: (case, its PTX per entry, the ptxas log)."""
    dirs = [where / str(i) for i in range(len(cases))]
    for d in dirs:
        d.mkdir()
    with ThreadPoolExecutor(4) as pool:
        built = list(pool.map(_early_build, [cuda_source(c) for c in cases], dirs))
    out = []
    for c, (ptx, log) in zip(cases, built, strict=True):
        assert "serializ" not in log, log[-3000:]
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
        assert len(spills) == len(KERNELS) and not any(spills), log
        out.append((c, _entries(ptx), log))
    return out


def _loads_before_the_first_wgmma(entry: str, stages: int) -> bool:
    """Whether the entry's PTX has the EARLY shape: its 8 weight loads (float2) ahead of
    its first wgmma, and a wait for all but `stages` commit groups (q's, the oldest)."""
    first = entry.index("wgmma.mma_async")
    weights = [m.start() for m in re.finditer(r"ld\.global\.nc\.v2\.f32", entry)]
    return (len(weights) == 8 and max(weights) < first
            and f"cp.async.wait_group {stages};" in entry[:first])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_early_loads_compile_for_sm90a_in_every_band(hand: Candidate, tmp_path: Path) -> None:
    """EARLY 1 with wgmma in all four bands, STAGES 1-4 x WARPS 4/8/16 (fused), cluster and
    two_pass: nvcc and ptxas build it with no spill and no serialised wgmma; its weight
    loads and its wait for q's commit group come before the first wgmma in every band
    kernel, and not so without EARLY."""
    cases = [wgmma_everywhere(hand, case) for case in EARLY_CASES]
    cases.append(wgmma_everywhere(hand, {"WARPS": 16, "STAGES": 3}))  # EARLY 0
    for c, entries, log in _built_without_spills(cases, tmp_path):
        assert "warning" not in log, log[-3000:]
        assert set(entries) == KERNELS
        for name in BAND_KERNELS:
            band = name[:2].upper()
            early = _loads_before_the_first_wgmma(entries[name], int(c.params[f"{band}_STAGES"]))
            assert early == (c.params[f"{band}_EARLY"] == 1), (name, c.params)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_slices_set_how_often_a_page_waits_for_the_tensor_cores(hand: Candidate, tmp_path: Path) -> None:
    """A page is 8 wgmmas (2 head halves x 4 K slices); SLICES of them go in flight per
    wait, so a band kernel's page loop waits 8, 4 or 2 times; with 16 warps and EARLY
    (the most registers) ptxas keeps every kernel in registers and serialises no wgmma."""
    cases = [wgmma_everywhere(hand, {"WARPS": 8, "SLICES": n}) for n in (1, 2, 4)]
    cases.append(wgmma_everywhere(hand, {"WARPS": 16, "SLICES": 4, "EARLY": 1}))
    for c, entries, _ in _built_without_spills(cases, tmp_path):
        for name in BAND_KERNELS:
            waits = 8 // int(c.params[f"{name[:2].upper()}_SLICES"])
            assert entries[name].count("wgmma.mma_async") == 8, name
            assert entries[name].count("wgmma.wait_group") == waits, (name, c.params)


def test_wgmma_sums_its_k_slices_in_fp32() -> None:
    """Every wgmma of the hand starts from a zero accumulator (scale-d 0): chaining K
    slices in Hopper's fp8 accumulator (about 13 bits, aligned to the running sum) cost
    ~1e-2 of a score, which swapped a token across the top-k boundary of a row whose
    boundary lay near zero (shape 70d53807, row 4, on the H200; see
    benchmarks/fp8_accumulation_model.py)."""
    source = (SEEDS / "cuda_family.cu").read_text()
    wgmmas = re.findall(r'"wgmma\.mma_async[^;]*;', source)
    assert wgmmas
    for instr in wgmmas:
        assert re.search(r",\s*0,\s*1,\s*1;$", instr), instr


# -- GATHER split: the cluster selects, no key gathered ----------------------------------

SPLIT_CASES: list[dict[str, ParamValue]] = [
    {"MODE": "cluster", "CTAS": 4, "GATHER": "split"},  # HIST select: counted after scoring
    {"MODE": "cluster", "CTAS": 8, "GATHER": "split", "HIST": "score", "RADIX_BITS": 8},  # while scoring
    {"MODE": "cluster", "CTAS": 2, "GATHER": "split", "SHORT": "first_cta", "RADIX_BITS": 12, "SCORE": "simt"},
    {"MODE": "cluster", "CTAS": 8, "GATHER": "split", "SCORE": "wgmma", "WARPS": 16, "EARLY": 1},
    {"MODE": "cluster", "CTAS": 4, "GATHER": "split", "SCORE": "wgmma", "WARPS": 8, "STAGES": 3,
     "HIST": "score", "RADIX_BITS": 10, "SWIZZLE": 0, "SLICES": 4},
    {"MODE": "cluster", "CTAS": 4, "GATHER": "split", "LOAD": "ldg", "SWIZZLE": 0, "SCORE": "f16"},
    {"MODE": "cluster", "CTAS": 2, "GATHER": "split", "LOAD": "bulk", "SWIZZLE": 0, "STAGES": 3, "WARPS": 2,
     "HIST": "score"},
]


def split_everywhere(c: Candidate, case: dict[str, ParamValue]) -> Candidate:
    values = {f"{band}_{name}": value for band in host.BANDS for name, value in case.items()}
    child = with_values(c, values)
    assert {k: child.params[k] for k in values} == values, "a split case was repaired away"
    return child


def test_split_needs_a_cluster_radix_select_of_several_ctas(hand: Candidate) -> None:
    """GATHER split is valid with MODE cluster, SELECT radix and CTAS > 1 only (the
    kernel's static_assert says the same); leader stays the default; split adds the 32
    bytes of its exchange words at the end of the layout and moves no other region."""
    constraints = declared(hand)
    assert all(hand.params[f"{band}_GATHER"] == "leader" for band in host.BANDS)
    for band in host.BANDS:
        ok = {**hand.params, f"{band}_MODE": "cluster", f"{band}_CTAS": 8, f"{band}_GATHER": "split"}
        assert not rules.violated(constraints, ok)
        for ctas in (2, 4, 8):
            assert not rules.violated(constraints, {**ok, f"{band}_CTAS": ctas})
        for bad in ({f"{band}_MODE": "fused"}, {f"{band}_MODE": "two_pass"},
                    {f"{band}_CTAS": 1, f"{band}_SHORT": "first_cta"}, {f"{band}_SELECT": "bitonic"}):
            assert rules.violated(constraints, {**ok, **bad}), bad
            assert not rules.violated(constraints, {**ok, **bad, f"{band}_GATHER": "leader"}), bad
        # the search proposes it only where it is valid: a request for split repairs the rest
        child = with_values(hand, {f"{band}_GATHER": "split"})
        assert child.params[f"{band}_GATHER"] == "split" and child.params[f"{band}_MODE"] == "cluster"
        assert child.params[f"{band}_SELECT"] == "radix" and int(child.params[f"{band}_CTAS"]) > 1
        assert not rules.violated(constraints, child.params)
        for hist in ("select", "score"):
            values = {**ok, f"{band}_HIST": hist}
            leader, split = (host.BandConfig.of({**values, f"{band}_GATHER": g}, band) for g in ("leader", "split"))
            pages = host.BAND_MAX_PAGES[band]
            a, b = host.smem_layout(leader, pages), host.smem_layout(split, pages)
            assert a["xchg"] == a["total"] == b["xchg"]  # empty for leader; split's at the end
            assert {k: v for k, v in a.items() if k != "total"} == {k: v for k, v in b.items() if k != "total"}
            assert b["total"] == a["total"] + 32


def test_the_kernel_asserts_splits_constraints() -> None:
    source = (SEEDS / "cuda_family.cu").read_text()
    assert "(GATHER == GATHER_SPLIT && MODE == MODE_CLUSTER && SELECT == SELECT_RADIX && CTAS > 1)" in source
    for band in host.BANDS:
        assert f'#error "{band}_GATHER must be leader or split"' in source


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvrtc(), reason="CuPy's NVRTC is not installed")
def test_the_split_select_compiles_for_sm90a_in_every_band(hand: Candidate) -> None:
    """GATHER split in all four bands with NVRTC: both HIST values, RADIX_BITS 8 to 12,
    clusters of 2, 4 and 8, every SCORE and LOAD."""
    covered: dict[str, set[ParamValue]] = {}
    for case in SPLIT_CASES:
        c = split_everywhere(hand, case)
        _compile(c)
        for name in ("HIST", "RADIX_BITS", "CTAS", "SCORE", "LOAD"):
            covered.setdefault(name, set()).add(c.params[f"MS_{name}"])
    assert covered["HIST"] == {"select", "score"} and covered["CTAS"] == {2, 4, 8}
    assert covered["SCORE"] == set(hand.space["MS_SCORE"].choices)
    assert covered["LOAD"] == set(hand.space["MS_LOAD"].choices)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_split_select_keeps_its_kernels_in_registers(hand: Candidate, tmp_path: Path) -> None:
    """nvcc and ptxas build GATHER split with wgmma scoring (16 warps, EARLY, clusters of 4
    and 8, both HIST values) with no spill and no serialised wgmma, and the band kernels
    hold the cluster's distributed shared memory atomics, stores and split barriers."""
    cases = [split_everywhere(hand, case) for case in (SPLIT_CASES[3], SPLIT_CASES[4])]
    cases.append(split_everywhere(hand, {**SPLIT_CASES[3], "CTAS": 4, "HIST": "score"}))
    for _, entries, _ in _built_without_spills(cases, tmp_path):
        for name in BAND_KERNELS:
            entry = entries[name]
            for instr in ("red.shared::cluster.add.u32", "atom.shared::cluster.add.u32",
                          "st.shared::cluster.u32", "st.shared::cluster.u16",
                          "barrier.cluster.arrive.release.aligned", "barrier.cluster.wait.acquire.aligned"):
                assert instr in entry, (name, instr)
            assert entry.count("barrier.cluster.arrive") == 4 == entry.count("barrier.cluster.wait"), name
            assert "ld.shared::cluster" not in entry, "split gathers nothing"


# -- phase timers (benchmarks/probe_kernels.py --phases) -------------------------------

BAND_KERNELS = ("ms_topk", "ml_topk", "ls_topk", "ll_topk")
PHASE_PATHS: list[dict[str, ParamValue]] = [
    {"SELECT": "bitonic"},                             # no radix stamps
    {"HIST": "score", "RADIX_BITS": 8},                # four radix passes: pass1..pass3
    {"CTAS": 1, "SHORT": "first_cta"},                 # fused without arrival counter
    {"MODE": "cluster", "CTAS": 1, "SHORT": "first_cta"},  # cluster without a cluster
    {"LOAD": "ldg", "SWIZZLE": 0},
    {"LOAD": "bulk", "SWIZZLE": 0},
    {"SCORE": "wgmma", "EARLY": 1},
    {"MODE": "cluster", "CTAS": 4, "GATHER": "split"},  # split_select's stamps
    {"SCORE": "wgmma", "EARLY": 1, "WARPS": 16, "MODE": "cluster", "CTAS": 8, "GATHER": "split",
     "HIST": "score", "RADIX_BITS": 8},
]


def phase_cases(c: Candidate) -> list[Candidate]:
    """Every MODE x SCORE pair the manifest allows on band MS (the rest at the defaults),
    then the paths above whose stamps differ."""
    constraints = declared(c)
    pairs = [{"MS_MODE": m, "MS_SCORE": s}
             for m, s in itertools.product(c.space["MS_MODE"].choices, c.space["MS_SCORE"].choices)]
    extra = [{f"MS_{k}": v for k, v in path.items()} for path in PHASE_PATHS]
    cases = []
    for values in pairs + extra:
        if rules.violated(constraints, {**c.params, **values}):
            assert values in pairs, f"{values}: not a valid path any more"
            continue
        child = with_values(c, values)
        assert {k: child.params[k] for k in values} == values, values
        cases.append(child)
    assert len(cases) >= len(pairs)
    return cases


def _nvcc_ptx(source: str, where: Path) -> str:
    """PTX of the source for sm_90a, after checking that ptxas builds it too."""
    (where / "kernel.cu").write_text(source)
    for out in ("ptx", "cubin"):
        proc = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", f"-{out}", "-o",
                               str(where / f"kernel.{out}"), str(where / "kernel.cu")],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        assert "warning" not in proc.stderr, proc.stderr[-3000:]
    return (where / "kernel.ptx").read_text()


def _entries(ptx: str) -> dict[str, str]:
    parts = re.split(r"\.entry\s+(\w+)\(", ptx)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_phase_timers_compile_on_every_path(hand: Candidate, tmp_path: Path) -> None:
    cases = phase_cases(hand)
    dirs = [tmp_path / str(i) for i in range(len(cases))]
    for d in dirs:
        d.mkdir()
    sources = [cuda_source(with_define(c, PHASE_DEFINE)) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        ptxs = list(pool.map(_nvcc_ptx, sources, dirs))
    for case, ptx in zip(cases, ptxs, strict=True):
        entries = _entries(ptx)
        assert set(entries) == KERNELS
        assert PHASE_BUFFER in ptx
        for name in BAND_KERNELS:  # every band stamps, the pt kernel does not
            assert "%globaltimer" in entries[name] and "%clock64" in entries[name], (name, case.params)
        assert "%globaltimer" not in entries["pt_topk"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("score", ["fp8", "wgmma"])
def test_without_the_define_the_kernels_hold_no_timer(hand: Candidate, tmp_path: Path,
                                                      score: str) -> None:
    """The judged build: no timer, no buffer, nothing of the probe's. (At the commit that
    added the timers, its cubins were byte-identical to the previous commit's, from nvcc,
    and from NVRTC without -lineinfo, which otherwise records the moved line numbers.)"""
    c = hand if score == "fp8" else wgmma_everywhere(hand, {"WARPS": 16})
    ptx = _nvcc_ptx(cuda_source(c), tmp_path)
    assert set(_entries(ptx)) == KERNELS
    for marker in ("%globaltimer", "%clock64", PHASE_BUFFER):
        assert marker not in ptx
