"""The sandbox evaluator's options, and what depends only on the device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

PEAK_BANDWIDTH_GBPS = {"H200": 4800.0, "H100": 3350.0, "B200": 8000.0, "A100": 2039.0}
"""Datasheet bandwidth by device name: a time under least-bytes / this is not real."""


def detect_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class SandboxConfig:
    device: str = "auto"
    timeout_s: float = 300.0
    """Limit for one candidate's whole evaluation; a hang past it is TIMEOUT."""
    isolate: bool = True
    """Confine candidate processes (namespaces, unprivileged user); off only for debugging."""
    cpu_memory_gb: float = 8.0
    """Address-space limit of a CPU candidate process (not on a GPU: CUDA maps far more
    virtual memory than it uses)."""
    seed: int = 0
    """Seeds every input the judge makes; the same seed gives the same inputs."""
    trials: int = 3
    """Checked calls per shape, each on fresh inputs."""
    batches: int = 3
    """Timed batches per shape; the figure is their median time per call."""
    target_batch_ms: float | None = None
    """How long one timed batch should last (None: 2 ms on a GPU, 30 ms on the CPU)."""
    sample_checks: int = 6
    """Calls per batch (warm-up and timed) checked in full; all are screened. A candidate
    faking a share f of its calls passes a shape with probability at most (1 - f) ** K,
    K = sample_checks x the batches it fakes in; one faking only in timed batches (it can
    tell them from warm-up ones) meets 6 x 3 = 18 with the defaults: 0.75 ** 18 = 0.6% for
    a candidate faking a quarter."""
    cupti_calls: int = 10
    """Eager calls timed with CUPTI per shape (GPU only; 0: none)."""
    slots: int | None = None
    """Most calls in one timed batch (each with inputs and outputs of its own). None: 256 on
    a GPU, where a fast kernel needs many calls to outlast a round trip; 64 on the CPU."""
    bases: int = 2
    cpu_threads: int = 1
    peak_bandwidth_gbps: float | None = None
    """Bandwidth for the speed-of-light bound; None: the device's datasheet figure."""
    overlap_checks: bool = True
    """Check while the candidate's process works on something else: the checked calls'
    outputs during its graph capture (GPU), every later step's after its last shape while
    it reports CUPTI and is killed. False: each at the end of its step or shape, as the
    process waits (what benchmarks/evaluator_throughput.py compares, design ``serial``)."""
    collect_first: bool = False
    """After a candidate's last shape, read its process's CUPTI records before the judge's
    deferred checks start, with the device otherwise idle, and only then kill it (in the
    background, while those checks run). False: the records are read and the process
    killed in the background while the checks run, both on the device at once
    (benchmarks/evaluator_throughput.py compares the two: designs ``*_collect_first``)."""
    policies: tuple[str, ...] = ()
    """Optional rule sets of the workload to enforce (e.g. ``no_library_topk``)."""
    static_screen: str = "reject"
    """``reject`` (default), ``warn`` or ``off``: what a static finding does."""
    baseline: str = "auto"
    """``published`` (the definition's reference, from ``trace_root``), ``own``, or
    ``auto``: published where a FlashInfer-Trace folder is configured."""
    trace_root: str | None = None
    build_cache: Path | None = None
    """Folder of compiled kernels (written by this process only); default <work_dir>/builds."""
    baseline_cache: Path | None = None
    """JSON file of baseline timings; default <work_dir>/baseline_timings.json."""
    prebuild_workers: int | None = None
    """Processes compiling queued CUDA candidates ahead. None: half the cores (at most 8)
    on a GPU machine, 0 on the CPU, where compiles would share the timing cores. With 4 on
    a 16-core H200 host (2026-12-05) a cuda_family landscape waited about 2 s on the
    compiles at every fourth point (``process_wait_s``, 0.77 s a point on average, of 1.16):
    judging outran building; 8 is not measured yet."""
    spares: int | None = None
    """Candidate processes kept started ahead (each starts in seconds: torch, the device,
    the shared memory). None: three quarters of the cores (at most 16) on a GPU machine, 1
    on the CPU. With 8 on a 16-core H100 host the pool ran dry once the first 8 were used
    (a candidate every 0.7-0.8 s; the next waited 0.1 s on average for its process)."""
    pipeline: bool = False
    """Two evaluations in flight (``SandboxEvaluator.concurrent_calls``): one candidate's
    checks, made after its last shape, run while the next candidate takes its process,
    loads and makes its untimed calls; the next is clocked only once those checks are
    over, and only one candidate's code is ever loaded at a time. Needs two lanes and a
    runtime that calls ``evaluate`` from two threads (both runtimes do). Off by default:
    on an H100 host (2026-12-06, benchmarks/results/throughput-dsa_topk-pipeline-h100-*)
    it judged 59.7 candidates a minute against 62.9 without it, side by side. The judge's
    steps are its own Python as much as waits on the candidate, and the two threads take
    turns on one interpreter lock: the next candidate reached its first clocked batch
    before the checks were over (0.15 s waited a candidate), and the checks took longer
    (0.21 s against 0.17)."""
    triton_store: bool = True
    """Share the Triton kernels that processes running a shipped seed's code compiled with
    every later candidate process, read-only (triton_store.py), so that a knob variant of a
    Triton seed compiles only the kernels its knobs change. Only where candidate processes
    are fully confined (namespaces and the unprivileged user); elsewhere off, and said."""
    triton_warm_workers: int | None = None
    """Processes compiling the Triton kernels of trusted candidates (a shipped seed's code,
    any knob values) ahead of their evaluation, into the store (triton_warm.py): the
    runtime's ``prepare`` queues them, and each is called once a shape on meta tensors with
    its launches only compiled, in one of these processes (each serves many candidates). None: a quarter of the cores (at most 4) on a GPU machine
    with the store, 0 elsewhere; 0 turns it off."""
    fork_server: bool = True
    """Fork candidate processes from one that imported torch once (zygote.py), rather than
    start each as a fresh interpreter; either way each is confined the same way before any
    candidate code exists in it. On a 16-core H100 host judging 75 candidates a minute, a
    fresh interpreter's start took 8.1 s, 5.2 s of it importing torch, and kept the host's
    cores 92% busy (2026-12-06, benchmarks/results/throughput-dsa_topk-spare_steps-h100-*).
    Where the server cannot start or fork, fresh interpreters are used and the
    environment record says so (``spawn``)."""
    quiet_graphs: bool = False
    """On a GPU, also make graph replays wait until no spare process is starting, as eager
    batches and every batch on the CPU do. Off by default, as the docstring of
    ``SandboxEvaluator._quiet`` long held that a process starting on the host does not
    lengthen a replay; the H200 suggests otherwise (2026-12-06, 73 cuda_radix points,
    ``benchmarks/timing_inflation.py`` on
    benchmarks/results/raw/landscape-dsa_topk-cuda_radix-judge-issue10-h200-*): the judge's
    figure was over twice the CUPTI span, or CUPTI not believed, on 42% of the first shapes
    judged in a process and 27% of the second (a replacement spare starts when a candidate
    takes its process: a CUDA context, shared memory mapped and bound), 3-8% of the later
    ones. With it, a taken spare is not replaced when a candidate takes it: once half of a
    lane's spares are used, the missing ones start together after a candidate's clocked
    shapes, so that one wait covers several starts. Measured on an H100 (2026-12-07,
    benchmarks/results/throughput-dsa_topk-quiet-h100-*, ``--designs judge,judge_quiet``),
    it cut the inflated share of shape timings from 8.8% to 5.8% (on first shapes it rose, 10% to
    14%) and throughput from 102 to 72 candidates a minute, with the red team 91 of 91:
    too little gain for its cost to be the default. On the H200 (2026-12-07,
    benchmarks/results/throughput-dsa_topk-quiet-h200-*) it helped less still: inflated
    shares 10.2% by default and 10.6% with it (first shapes 18% and 28%), at 94 against 66
    candidates a minute."""
    lanes: int = 2
    """Sets of shared chunks that consecutive candidates take in turn (lanes.py). With 2, a
    candidate's process loads and makes its untimed calls while the one before it is still
    being killed, and the judge waits for that death only before timing it; with 1, each
    candidate waits for it before it loads. Each lane holds its own slots of every shape."""
    bank_memory_gb: float | None = None
    """Memory all shapes' inputs, expected outputs and every lane's slots may take before
    shapes are dropped, the one needed last first (None: on a GPU, 45% of the device's memory or 48
    GiB a lane, whichever is less: 59 GiB on an H200 with two lanes; 4 GiB on the CPU).
    An evaluation over more shapes than fit makes some of them anew for every candidate
    (a warning says so): raise it, or use fewer lanes."""
