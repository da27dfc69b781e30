"""The sandbox evaluator: untrusted candidates judged in confined processes.

``SandboxEvaluator`` is the evaluator a search uses on a GPU or a CPU. Its own
process is the judge: it makes every input, computes every expected output with
the workload's reference, owns the shared memory, keeps the clock, checks and
writes the verdict. A candidate's build, host code and kernels run only in a
process of their own (candidate_process.py, forked by zygote.py), confined
(isolation.py), reached through one socket, and killed with everything it started
when its evaluation ends. CUDA
sources are compiled in confined compiler processes (prebuild.py), whose binaries
only this process stores; a shipped seed's Triton variants have their kernels compiled
ahead by warming processes (triton_warm.py), into the store of seed kernels
(triton_store.py). How a candidate's process starts (forked by the fork server, else a
fresh interpreter) is process_supply.py's business; keeping the judge's inputs per shape
and lane within their memory budget is bank_store.py's.

Per candidate: static screen (advisory by default it rejects; the runtime boundary is
the defence) -> a spare process of the candidate's lane (lanes.py) -> build (``load``)
-> per shape, the judge's cascade (judge.py) -> the process is killed, in the
background, while the judge checks the answers it kept. The baseline (baseline.py) is
timed once per shape per run by the same judge, and attached to every shape result.

Pipeline (``SandboxConfig.pipeline``, off by default: measured no faster, see there;
``concurrent_calls`` = 2): a runtime calls ``evaluate`` from
two threads. One holds the head (``_head``: process taken, candidate loaded, every shape
judged and clocked) while the other's candidate, past its last shape, is checked
(``Settling``); the next candidate loads and makes its untimed calls during those checks,
and is clocked only once they are over. Only one candidate's code is loaded at a time,
and nothing but the judged candidate runs on the device while it is clocked.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from evokernel.candidate import Candidate, Language
from evokernel.evaluate.bank import BankConfig, ShapeBank, derived_seed
from evokernel.evaluate.bank_store import BankStore
from evokernel.evaluate.baseline import Baseline, TimingStore, choose
from evokernel.evaluate.build import arch_for_capability
from evokernel.evaluate.channel import ChannelClosed, ChannelTimeout, ProtocolError
from evokernel.evaluate.environment import fingerprint
from evokernel.evaluate.isolation import Isolation, probe
from evokernel.evaluate.judge import (
    SIZING_BATCHES,
    CuptiCollect,
    Deferred,
    Judge,
    JudgeConfig,
    Verdict,
)
from evokernel.evaluate.lanes import Lane, Settling
from evokernel.evaluate.options import PEAK_BANDWIDTH_GBPS, SandboxConfig, detect_device
from evokernel.evaluate.prebuild import Prebuilder
from evokernel.evaluate.process import CandidateFault, CandidateHandle, SparePool
from evokernel.evaluate.process_supply import ProcessSupply
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.evaluate.static import policy_rules, static_violations
from evokernel.evaluate.triton_store import PRIVATE_CACHE, TritonStore
from evokernel.evaluate.triton_warm import TritonWarmer
from evokernel.workload import Workload, load_workload

log = logging.getLogger(__name__)

__all__ = ["SandboxConfig", "SandboxEvaluator", "detect_device"]

_LOG_LIMIT = 64 * 1024
DEFER_BYTES = 1 << 30
"""Most memory the copies kept for one candidate's deferred checks may take: past it, they
are checked before the next shape (``Judge.settle``)."""
RECALIBRATE_EVERY = 64
"""Candidates between two measurements of the round trip (``_round_trip``)."""
OVERLAP_FREE_BYTES = 32 << 30
"""Device memory that must be free for a candidate to load beside a dying one
(``_crowded``)."""

class SandboxEvaluator:
    """Evaluates candidates of one workload in confined processes, judged here."""

    def __init__(
        self,
        workload_name: str,
        *,
        device: str = "auto",
        timeout_s: float = 300.0,
        work_dir: Path | None = None,
        prebuild_workers: int | None = None,
        config: SandboxConfig | None = None,
        **options: Any,
    ) -> None:
        if config is None:
            config = SandboxConfig(device=device, timeout_s=timeout_s,
                                   prebuild_workers=prebuild_workers, **options)
        elif options:
            raise TypeError(f"unexpected options beside config: {sorted(options)}")
        self.config = config
        if self.config.device == "auto":
            self.config.device = detect_device()
        self.device = torch.device(self.config.device)
        if self.config.static_screen not in ("reject", "warn", "off"):
            raise ValueError(f"static_screen must be reject, warn or off, not {config.static_screen!r}")
        self.workload: Workload = load_workload(workload_name)
        policy_rules(self.workload, self.config.policies)  # unknown names fail here, not later
        self.baseline: Baseline = choose(
            self.config.baseline, self.workload.definition.name, self.workload.reference_source,
            str(self.workload.directory / self.workload.manifest.reference), self.config.trace_root,
        )
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="evokernel-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work_dir, 0o700)
        gpu = self.device.type == "cuda"
        memory_limit = None if gpu else self.config.cpu_memory_gb
        self.isolation: Isolation = probe(self.config.isolate, memory_limit)
        self.judge = Judge(self._judge_config(), self.device)
        self._salt = secrets.token_hex(16)  # inputs no candidate can regenerate ahead
        self._lock = threading.Lock()
        """Guards the candidate count, the round trip and the prebuilder (the banks have a
        lock of their own: ``BankStore``)."""
        self._head = threading.Lock()
        """Held from a candidate's process taken to its last clocked step (and while the
        baseline is timed): one candidate's code loaded and judged at a time."""
        self._settling = Settling()
        self._round_trip_s: float | None = None
        """The round trip every timed batch subtracts (``_round_trip``), and the candidate
        count when it was measured."""
        self._round_trip_at = 0
        self.baseline_spent: dict[str, float] = {}
        """Where timing the baseline went, summed over the shapes timed so far (not those
        read from the cache): ``banks_s`` making the judge's inputs and expected outputs,
        ``judge_s`` the baseline's checked calls, batches and CUPTI, ``shapes``."""
        self._baseline_path = self.config.baseline_cache or self.work_dir / "baseline_timings.json"
        self._baseline_store = TimingStore(self._baseline_path)
        self._environment: dict[str, str] | None = None
        self._prebuilder: Prebuilder | None = None
        self._warmer: TritonWarmer | None = None
        self._counter = 0
        self._build_cache = self.config.build_cache or self.work_dir / "builds"
        self.triton_store: TritonStore | None = None
        """The Triton kernels processes running a shipped seed's code compiled, shared
        read-only (triton_store.py): only where candidate processes are fully confined."""
        if self.config.triton_store and self.isolation.sealed:
            self.triton_store = TritonStore(self._build_cache / "triton", self.workload.seeds())
        elif self.config.triton_store:
            log.info("no Triton store: candidate processes are not fully confined here (%s)",
                     self.isolation.describe())
        self._supply = ProcessSupply(self.config.device, self.isolation, self.work_dir / "logs",
                                     self.config.cpu_threads, fork_server=self.config.fork_server,
                                     env=self.triton_store.environment() if self.triton_store else None)
        """How candidate processes start (fork server, else fresh interpreters)."""
        cores = os.cpu_count() or 2
        spares = self.config.spares if self.config.spares is not None else (
            min(16, max(2, cores * 3 // 4)) if gpu else 1)
        lanes = max(1, self.config.lanes)
        self._bank_store = BankStore(
            self.workload, self.device, lanes, self._bank_config(),
            memory_gb=self.config.bank_memory_gb,
            await_unmapped=lambda: self._await_every_lane(),
            refresh_spares=lambda index: self._lanes[index].pool.refresh())
        """Per shape, the judge's inputs in one bank per lane (twins: ``ShapeBank.twin``)."""
        self._lanes = [self._lane(i, max(1, -(-spares // lanes))) for i in range(lanes)]

    @property
    def concurrent_calls(self) -> int:
        """``evaluate`` calls a runtime may keep in flight (``evokernel.evaluate.Concurrent``):
        2 where ``SandboxConfig.pipeline`` is on and there are two lanes or more, else 1."""
        return 2 if self.config.pipeline and len(self._lanes) >= 2 else 1

    def _lane(self, index: int, spares: int) -> Lane:
        return Lane(index, SparePool(
            spares, self._supply.start, lambda: self._bank_store.chunks(index),
            lambda: self._bank_store.slots(index), name=f"lane{index}", started=self._supply.started))

    def _bank_config(self) -> BankConfig:
        """The banks' settings but their memory, which the store sets from its budget."""
        gpu = self.device.type == "cuda"
        return BankConfig(seed=self.config.seed, salt=self._salt, bases=self.config.bases,
                          slots=self.config.slots or (256 if gpu else 64),
                          trials=self.config.trials,
                          batches=self.config.batches,
                          sizing_batches=SIZING_BATCHES + 1,  # and a graph replay
                          cupti_calls=self.config.cupti_calls if gpu else 0)

    def _judge_config(self) -> JudgeConfig:
        gpu = self.device.type == "cuda"
        target_ms = self.config.target_batch_ms or (2.0 if gpu else 30.0)
        bandwidth = self.config.peak_bandwidth_gbps
        if bandwidth is None and gpu:
            name = torch.cuda.get_device_name(self.device)
            bandwidth = next((bw for key, bw in PEAK_BANDWIDTH_GBPS.items() if key in name), None)
        return JudgeConfig(
            trials=self.config.trials, batches=self.config.batches, target_batch_s=target_ms / 1e3,
            sample_checks=self.config.sample_checks, cupti_calls=self.config.cupti_calls,
            peak_bandwidth_gbps=bandwidth, overlap_checks=self.config.overlap_checks,
        )

    # -- processes and memory --------------------------------------------------------------

    def _fresh_process(self, lane: int = 0, attempts: int = 3) -> CandidateHandle:
        """A started process of ``lane`` with that lane's chunks mapped (and no other's),
        before any candidate code is loaded into it. It has no round trip yet
        (``_round_trip``)."""
        problem: Exception | None = None
        for _ in range(attempts):
            # with quiet_graphs the replacement starts once this candidate's clocked shapes
            # are over (``_evaluate``), not beside them: every clocked batch would wait for it
            handle = self._lanes[lane].pool.take(refill=not self.config.quiet_graphs)
            try:
                handle.map(self._bank_store.chunks(lane))
                return handle
            except (CandidateFault, ChannelClosed, ChannelTimeout, ProtocolError) as exc:
                problem = exc
                log.warning("a started candidate process failed before use: %s", exc)
                handle.kill()
        raise RuntimeError(f"no candidate process could be started: {problem}")

    def _round_trip(self, handle: CandidateHandle, lane: int = 0) -> CandidateHandle:
        """``handle`` with the round trip every timed batch subtracts: the run's figure,
        measured on a fresh process before any candidate code is loaded, again every
        ``RECALIBRATE_EVERY`` candidates. It is measured as a batch sees it, right after
        the judge's own device work, with a tiny kernel of the process's own (the switch
        between the two contexts is part of it, not of the candidate's time), and only
        once every lane is retired: a used process dying (its context torn down, or
        kernels it left running) or a scrub would lengthen it, and every timed batch
        after would be shortened by that much. One figure for the run also keeps the
        noise of a per-process measurement out of the comparison of candidates. Returns
        ``handle``, or another fresh process of ``lane`` where it failed (a spare can die
        while it waits)."""
        with self._lock:
            due = (self._round_trip_s is None
                   or self._counter - self._round_trip_at >= RECALIBRATE_EVERY)
        if not due:
            handle.rtt_s = self._round_trip_s
            return handle
        for _ in range(3):
            try:
                self._await_every_lane()
                handle.calibrate(self.judge.before_batch)
                if self.device.type == "cuda" and self.judge.least_span_s is None:
                    self.judge.least_span_s = handle.least_span_s()
                with self._lock:
                    self._round_trip_s, self._round_trip_at = handle.rtt_s, self._counter
                return handle
            except (CandidateFault, ChannelClosed, ChannelTimeout, ProtocolError) as exc:
                log.warning("a started candidate process failed before use: %s", exc)
                handle.kill()
                handle = self._fresh_process(lane)
        raise RuntimeError("no candidate process lived through the round-trip measurement")

    def _retire(self, handle: CandidateHandle, lane: int = 0,
                spent: dict[str, float] | None = None) -> None:
        """Kill a used process of ``lane`` (returns once everything it started is gone),
        then scrub every chunk of that lane, so nothing it left reaches the next one. A
        process that ran a shipped seed's code first has the Triton kernels it compiled
        copied into the store (``_admit_kernels``), while it lives; whatever that raises,
        the kill and the scrub follow. If a process outlives its kill, a scrub proves
        nothing (it can write again after it): every bank is dropped instead, before that
        lane serves again (``_await_retired``). ``spent`` gets the seconds of each step."""
        spent = {} if spent is None else spent
        try:
            if self.triton_store is not None and handle.trusted:
                admitting = time.perf_counter()
                self._admit_kernels(handle)
                spent["admit_s"] = time.perf_counter() - admitting
        finally:  # whatever admitting raised, the process dies and its lane is scrubbed
            started = time.perf_counter()
            gone = handle.kill()
        spent["kill_s"] = time.perf_counter() - started
        if not gone:
            log.error("a used candidate process outlived its kill; the shared chunks it "
                      "mapped are dropped, and every shape's slots are made anew")
            self._lanes[lane].outlived = True
            return
        handle.trim_log()
        for bank in self._bank_store.lane_banks(lane):
            bank.scrub()
        spent["scrub_s"] = time.perf_counter() - started - spent["kill_s"]

    def _admit_kernels(self, handle: CandidateHandle) -> None:
        """Keep the Triton kernels a trusted process compiled (``TritonStore.admit``),
        read from its private cache while it lives, before it is killed."""
        assert self.triton_store is not None
        root = handle.private_root()
        if root is None:
            return
        try:
            added = self.triton_store.admit(root, PRIVATE_CACHE, handle.first_alive)
        except Exception as exc:  # an optimisation: its failure costs compiles, not a verdict
            log.warning("the Triton kernels of a seed's process could not be kept: %s", exc)
            return
        if added:
            log.debug("kept %d compiled Triton kernels of a seed's process", added)

    def _retire_behind(self, handle: CandidateHandle, lane: int,
                       collect: CuptiCollect | None = None) -> threading.Event:
        """``_retire`` in the background, after reading ``collect``'s reply (the process's
        last words) where one is due: the next candidates' starts overlap the kill. The
        returned event is set once ``collect`` is read."""
        received = threading.Event()

        def steps(spent: dict[str, float]) -> None:
            try:
                if collect is not None:
                    _read_records(collect, spent)
            finally:
                received.set()
            self._retire(handle, lane, spent)

        self._lanes[lane].retire_behind(steps)
        return received

    def wait_retired(self) -> None:
        """Return once every evaluated candidate's process and everything it started are
        gone. ``evaluate`` returns before that (the kill overlaps the next candidates'
        start); a lane's next candidate, and ``close``, wait for it."""
        self._await_every_lane()

    def _await_retired(self, lane: int, spent: dict[str, float] | None = None) -> float:
        """Return once ``lane``'s last process is gone and its chunks scrubbed, with the
        seconds waited; raise if that failed (then no other candidate may use the
        chunks). ``spent`` gets what that retiring took per step (``behind_<step>``).
        Where the process outlived its kill, the lane gets new chunks here
        (``BankStore.renew_lane``)."""
        waited = self._lanes[lane].await_retired()
        if spent is not None:
            for step, seconds in self._lanes[lane].take_retired_in().items():
                spent[f"behind_{step}"] = seconds
        if self._lanes[lane].outlived:
            self._lanes[lane].outlived = False
            # a process that outlived its kill may still write the old chunks
            self._bank_store.renew_lane(lane)
        return waited

    def _crowded(self) -> bool:
        """Whether the device is too full for the next candidate to load beside a dying
        one: a process holds its device memory until its context is torn down, and one
        that took most of it (by need, or to make its successor fail for want of memory)
        would leave the next candidate none. With less than ``OVERLAP_FREE_BYTES`` free
        while another lane retires, the next loads only once that death is over."""
        if not any(lane.retiring() for lane in self._lanes):
            return False
        free = self._free_device_bytes()
        return free is not None and free < OVERLAP_FREE_BYTES

    def _free_device_bytes(self) -> int | None:
        """Free memory of the device (None on the CPU, where memory is bounded per process)."""
        if self.device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free)

    def _await_every_lane(self) -> None:
        """Return once no earlier candidate's checks run and every lane is retired."""
        self._settling.wait()
        for index in range(len(self._lanes)):
            self._await_retired(index)

    def _quiet(self, lane: int, spent: dict[str, float], eager: bool = False) -> float:
        """Wait until every other lane's last process is gone and scrubbed: before
        ``lane``'s candidate is clocked (``Judge.judge_shape`` calls this before it
        writes a clocked batch's inputs), nothing of an earlier one may run on the device;
        and before a bank is made in the middle of its evaluation (``bank`` waits for
        every lane), so that the time limit can leave that wait out.
        Where the clocked time holds the candidate's host work (the CPU; on a GPU a batch
        of ``eager`` calls, whose launches and syncs the clock counts), it also waits for
        every spare process still starting: a replacement started right after a quick
        failure halved the next candidate's fitness on the CPU (the red team's
        ``sends_deep_json.py`` then ``torch_loop.py``), and on an H100 host the eager
        ``torch_loop.py`` right after ``poisons_later.py`` got 0.40 of its fitness alone.
        A graph replay's time is the device's, which a process starting on the host was held
        not to lengthen: those batches wait for spares only with ``quiet_graphs`` (the H200
        measured the first shapes of a process inflated: see that option).
        A process warming Triton kernels ahead (triton_warm.py) is waited for in the same
        cases while it starts; not its compiles (which, like the CUDA prebuild's, run beside
        clocked batches), nor its death when it is replaced (rare: every 64 candidates).
        Returns the seconds waited (charged to ``quiet_wait_s``; the previous process's
        kill and scrub seconds go to ``behind_kill_s`` and ``behind_scrub_s``)."""
        waited = self._settling.wait()  # an earlier candidate's checks (pipeline)
        for other in self._lanes:
            if other.index != lane:
                waited += self._await_retired(other.index, spent)
        if self.device.type == "cpu" or eager or self.config.quiet_graphs:
            for each in self._lanes:
                waited += each.pool.await_started()
            if self._warmer is not None:  # its processes start as rarely as they die
                waited += self._warmer.await_started()
        spent["quiet_wait_s"] = spent.get("quiet_wait_s", 0.0) + waited
        return waited

    def _refill(self, lane: int) -> None:
        """With ``quiet_graphs``: once half of ``lane``'s spares are used, start all the
        missing ones together, between clocked shapes; every clocked batch waits for starts
        (``_quiet``), so starts made together cost one wait, not one a candidate."""
        pool = self._lanes[lane].pool
        pool.fill(low_water=pool.size // 2)

    def _judge_rng(self, candidate_id: str, counter: int) -> random.Random:
        """The judge's choices for one evaluation (checked slots, variant order, the
        sample of each batch). Salted like the inputs: from the run seed (public), the
        candidate's id (its process can read it) and the evaluation's number (a few
        guesses, told apart by the trials' slots) alone, a candidate could replay them
        and fake exactly the calls that go unchecked."""
        return random.Random(derived_seed(self.config.seed, self._salt, candidate_id, counter))

    def bank(self, shape: str, lane: int = 0) -> ShapeBank:
        """The judge's inputs for a shape in ``lane``'s chunks (made once for every lane;
        shapes dropped to stay within the budget, the one predicted to be needed last first:
        before a new one is made, room for it as large as the largest made so far; after,
        whatever it took beyond that). A device with too little free memory even then (its
        other tenants, torch's cache) lowers the budget to what it held, drops shapes and
        tries again, then raises ``DeviceMemoryError``. ``BankStore.bank`` says what it
        waits for; bank_store.py's docstring how it chooses."""
        return self._bank_store.bank(shape, lane)

    def bank_room(self, shape: str) -> int:
        """How many shapes the size of ``shape``'s inputs the judge holds at once (every
        lane's slots and its own stores, within ``bank_memory_gb``, a quarter spare): a
        benchmark that judges several subjects on more shapes than that judges them group
        by group, so that no shape's inputs are made anew for each subject. Makes the
        shape's bank. The three workloads' shapes share their caches' or weights' size,
        which dominate, so one shape speaks for the others."""
        return self._bank_store.room(shape)

    # -- environment and baseline ----------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """What a timing depends on besides the kernel, and how candidates were confined."""
        if self._environment is None:
            env = fingerprint(self.device)
            env["sandbox"] = self.isolation.describe() + (
                ", Triton store of seed kernels" if self.triton_store is not None else "") + (
                ", seeds' Triton kernels warmed ahead" if self.warm_workers() else "")
            env["baseline"] = f"{self.baseline.kind} ({self.baseline.origin})"
            self._environment = env
        # how processes start can change (a fork server that stopped): read each time
        return {**self._environment, "spawn": self._supply.describe()}

    def _baseline_key(self, shape: str) -> str:
        env = json.dumps({k: v for k, v in self.environment().items() if k not in ("sandbox", "spawn")},
                         sort_keys=True)
        parts = [self.workload.name, self.baseline.source, env, str(self.config.seed), shape]
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]

    def warm_up(self, shapes: Sequence[str]) -> dict[str, Timing]:
        """A run's set-up, once before its first candidate: the baseline timed on
        ``shapes`` (and their inputs and expected outputs made), then every spare process
        started with those shapes bound. ``evaluate`` does all of it as it goes otherwise,
        in its first candidates' time. Returns the baseline timings."""
        timings = self.baseline_timings(shapes)
        for shape in shapes:
            self.bank(shape)
        for lane in self._lanes:
            lane.pool.ready()
        return timings

    def baseline_timings(self, shapes: Sequence[str]) -> dict[str, Timing]:
        """The baseline's timing per shape: measured once per run (and cached on disk)."""
        return self._baseline_store.get(shapes, self._baseline_key, self._time_baseline)

    def _time_baseline(self, shapes: Sequence[str]) -> dict[str, Timing]:
        with self._head:  # no candidate's code loaded while the baseline is clocked
            timings = self._time_baseline_alone(shapes)
            # the reference's process, whose memory may have lowered the banks' ceiling as
            # they were made beside it, is gone: the run's banks get the whole budget
            self._bank_store.lift_cap()
            return timings

    def _time_baseline_alone(self, shapes: Sequence[str]) -> dict[str, Timing]:
        for attempt in range(2):
            self._await_every_lane()  # banks may be made or dropped here: no scrub may be running
            handle = self._round_trip(self._fresh_process())
            try:
                return self._time_baseline_in(handle, shapes)
            except Exception as exc:
                # a fork server that stopped took the process with it: once more, fresh
                if attempt == 0 and self._supply.server_stopped(handle):
                    log.warning("the fork server stopped while the baseline was timed (%s); "
                                "timed again in a fresh interpreter", exc)
                    continue
                raise
            finally:
                self._retire(handle)
        raise AssertionError("unreachable")

    def _time_baseline_in(self, handle: CandidateHandle, shapes: Sequence[str]) -> dict[str, Timing]:
        """The baseline loaded into ``handle`` and judged on every shape."""
        deadline = time.monotonic() + max(self.config.timeout_s, 600.0) * len(shapes)
        reply = handle.request("load", 120.0, reference=self.baseline.source,
                               input_count=len(self.workload.input_names))
        if "error" in reply:
            raise RuntimeError(f"the {self.baseline.kind} reference does not load: {reply['error']}")
        results = []
        self.judge.begin()
        spent = self.baseline_spent
        for shape in shapes:
            making = time.perf_counter()
            bank = self.bank(shape)
            handle.map(self._bank_store.chunks())
            judging = time.perf_counter()
            spent["banks_s"] = spent.get("banks_s", 0.0) + judging - making
            result, _ = self.judge.judge_shape(handle, bank, random.Random(0), deadline)
            spent["judge_s"] = spent.get("judge_s", 0.0) + time.perf_counter() - judging
            spent["shapes"] = spent.get("shapes", 0.0) + 1
            if result.status is not Status.PASSED or result.timing is None:
                raise RuntimeError(
                    f"the {self.baseline.kind} reference ({self.baseline.origin}) fails the "
                    f"workload's own check on shape {shape}: {result.message[:500]}"
                )
            results.append(result)
        results = self.judge.collect_cupti(handle, results, deadline)
        return {r.shape: r.timing for r in results if r.timing is not None}

    # -- building ahead ------------------------------------------------------------------

    def prebuild_workers(self) -> int:
        """How many processes build ahead (the configured number, or the device default)."""
        workers = self.config.prebuild_workers
        if workers is None:
            cores = os.cpu_count() or 2
            workers = min(8, max(1, cores // 2)) if self.device.type == "cuda" else 0
        return max(0, workers)

    def _builder(self) -> Prebuilder:
        with self._lock:
            if self._prebuilder is None:
                if self.device.type == "cuda":
                    major, minor = torch.cuda.get_device_capability(self.device)
                    compiler, arch = "nvrtc", arch_for_capability(major, minor)
                else:
                    compiler, arch = "nvcc", "sm_90a"  # what a CPU evaluation checks
                self._prebuilder = Prebuilder(
                    self._build_cache, compiler=compiler, arch=arch,
                    workers=self.prebuild_workers(), isolation=self.isolation,
                    timeout_s=self.config.timeout_s,
                )
            return self._prebuilder

    def warm_workers(self) -> int:
        """How many processes warm trusted Triton candidates ahead (triton_warm.py): the
        configured number, or the device default; 0 without the store."""
        if self.triton_store is None:
            return 0
        workers = self.config.triton_warm_workers
        if workers is None:
            cores = os.cpu_count() or 2
            workers = min(4, max(1, cores // 4)) if self.device.type == "cuda" else 0
        return max(0, workers)

    def _triton_warmer(self) -> TritonWarmer:
        with self._lock:
            if self._warmer is None:
                self._warmer = TritonWarmer(
                    self._supply.start, self._supply.started, self._load_fields,
                    self._admit_kernels, workers=self.warm_workers(),
                    timeout_s=self.config.timeout_s)
            return self._warmer

    def _load_fields(self, candidate: Candidate, cubin: bytes | None = None) -> dict[str, Any]:
        """The ``load`` request's fields for ``candidate`` (and its CUDA binary, if built)."""
        arch = None
        if self.device.type == "cuda":
            arch = arch_for_capability(*torch.cuda.get_device_capability(self.device))
        return {"candidate": candidate.model_dump(mode="json"),
                "arguments": [*self.workload.input_names, *self.workload.output_names],
                "arch": arch, "cubin": base64.b64encode(cubin).decode() if cubin else None,
                "threads": self.config.cpu_threads}

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Start compiling these candidates' CUDA sources and the trusted ones' Triton
        kernels (for every shape whose inputs the judge holds), and starting processes;
        returns at once."""
        for lane in self._lanes:
            lane.pool.fill()
        warming = self.warm_workers() > 0
        if self.prebuild_workers() == 0 and not warming:
            return
        screened = [c for c in candidates if c.workload == self.workload.name
                    and not static_violations(c, self.workload, self.config.policies)]
        if screened and self.prebuild_workers() > 0:
            self._builder().submit(screened)
        trusted = [c for c in screened if self._warms(c)]
        if trusted and warming:
            shapes = {shape: slots[0] for shape, slots in self._bank_store.slots(0).items() if slots}
            self._triton_warmer().submit(trusted, shapes)

    def _warms(self, candidate: Candidate) -> bool:
        """Whether ``prepare`` warms this candidate's Triton kernels: a Triton candidate of
        a shipped seed's code (``TritonStore.trusts``), whose compiles the store may keep."""
        return (candidate.language is Language.TRITON and self.triton_store is not None
                and self.triton_store.trusts(candidate))

    def warmed_ahead(self) -> int:
        """How many candidates a warming process compiled kernels for (``prepare``)."""
        return 0 if self._warmer is None else self._warmer.warmed

    def wait_for_warm(self, timeout_s: float) -> bool:
        """Block until the warms started by ``prepare`` are over (benchmarks, tests)."""
        return self._warmer is None or self._warmer.idle(timeout_s)

    def wait_for_builds(self, timeout_s: float) -> bool:
        """Block until the compiles started by ``prepare`` are over (benchmarks, tests)."""
        return self._prebuilder is None or self._prebuilder.idle(timeout_s)

    # -- the Evaluator protocol ----------------------------------------------------------

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        return self._evaluate(candidate, list(shapes))

    def _evaluate(self, candidate: Candidate, shapes: list[str]) -> Evaluation:
        started = time.perf_counter()
        env = self.environment()

        def verdict(status: Status, feedback: str, **extra: Any) -> Evaluation:
            return Evaluation(candidate_id=candidate.id, status=status, feedback=feedback,
                              environment=env, wall_s=time.perf_counter() - started, **extra)

        if candidate.workload != self.workload.name:
            return verdict(Status.REJECTED, f"candidate is for workload {candidate.workload!r}, "
                                            f"not {self.workload.name!r}")
        if self.config.static_screen != "off":
            violations = static_violations(candidate, self.workload, self.config.policies)
            if violations and self.config.static_screen == "reject":
                return verdict(Status.REJECTED, "; ".join(violations))
            for violation in violations:
                log.warning("static screen (warn only): %s: %s", candidate.id, violation)
        resources: dict[str, float] = {}
        cubin: bytes | None = None
        if candidate.language is Language.CUDA:
            built = self._builder().build(candidate)
            if built.unavailable:
                return verdict(Status.SKIPPED, f"cuda candidate not built: {built.error}; "
                                               "running it needs a GPU")
            if built.binary is None:
                return verdict(Status.BUILD_FAILED, _first_lines(built.error), log=built.error[-_LOG_LIMIT:])
            resources = {k: float(v) for k, v in built.meta.get("resources", {}).items()}
            resources["build_cached"] = 1.0 if built.cached else 0.0
            resources["build_s"] = 0.0 if built.cached else float(built.meta.get("build_s", 0.0))
            if self.device.type != "cuda":
                return verdict(Status.SKIPPED, "built with nvcc for sm_90a; running it needs a GPU, "
                                               "and this machine has none", resources=resources)
            cubin = built.binary
        elif candidate.language is Language.TRITON and self.device.type != "cuda":
            return verdict(Status.SKIPPED, "triton kernels need a GPU; this machine has none, "
                                           "so it was not run")
        reference = self.baseline_timings(shapes)
        return self._judge(candidate, shapes, cubin, resources, reference, verdict, started)

    def _judge(self, candidate: Candidate, shapes: list[str], cubin: bytes | None,
               resources: dict[str, float], reference: dict[str, Timing],
               verdict: Callable[..., Evaluation], started: float) -> Evaluation:
        for attempt in range(2):
            turn = _HeadTurn(self._head)  # the candidate before has reached its checks
            try:
                evaluation = self._judge_turn(candidate, shapes, cubin, dict(resources), reference,
                                              verdict, started, turn)
            finally:
                turn.release()
            # a fork server that stopped took the process with it (its forks die with it):
            # that failure is not the candidate's, which is judged once more, in a fresh
            # interpreter (once: a candidate cannot stop the server, and a second failure
            # stands)
            if (attempt == 0 and evaluation.status is not Status.PASSED and turn.handle is not None
                    and self._supply.server_stopped(turn.handle)):
                log.warning("candidate %s: the fork server stopped while its process was judged "
                            "(%s); judged again in a fresh interpreter", candidate.id[:16],
                            evaluation.feedback[:200])
                continue
            return evaluation
        raise AssertionError("unreachable")

    def _judge_turn(self, candidate: Candidate, shapes: list[str], cubin: bytes | None,
                    resources: dict[str, float], reference: dict[str, Timing],
                    verdict: Callable[..., Evaluation], started: float,
                    turn: _HeadTurn) -> Evaluation:
        head_wait = turn.waited_s
        with self._lock:
            self._counter += 1
            counter = self._counter
        lane = counter % len(self._lanes)
        taking = time.perf_counter()
        handle = self._fresh_process(lane)  # overlaps the earlier candidates' retiring
        # process_wait_s counts from the evaluation's start (screen and build lookup too,
        # not the wait for the candidate before to reach its checks: head_wait_s);
        # take_s is the wait for the spare process alone
        spent = {"process_wait_s": time.perf_counter() - started - head_wait,
                 "take_s": time.perf_counter() - taking, "head_wait_s": head_wait}
        if handle.ready_in_s is not None:  # how long that spare took to start (diagnosis)
            spent["spare_start_s"] = handle.ready_in_s
            spent.update(handle.start_steps_s)
        results: list[ShapeResult] = []
        device_s = 0.0
        retired = False
        rng = self._judge_rng(candidate.id, counter)
        try:
            waiting = time.perf_counter()
            # the lane's last candidate (lanes - 1 candidates ago) is gone and its chunks
            # scrubbed before this one loads; other lanes' may still be dying
            self._await_retired(lane, spent)
            spent["retire_wait_s"] = time.perf_counter() - waiting
            # where the lane was renewed (its last process outlived its kill), this process
            # still maps the old chunks, which that process may write: let them go now,
            # before any candidate code is loaded
            try:
                handle.map(self._bank_store.chunks(lane))
            except (CandidateFault, ChannelClosed, ChannelTimeout, ProtocolError) as exc:
                log.warning("a started candidate process failed before use: %s", exc)
                handle.kill()
                handle = self._fresh_process(lane)
            handle = self._round_trip(handle, lane)
            turn.handle = handle
            spent["calibrate_s"] = time.perf_counter() - waiting - spent["retire_wait_s"]
            if self._crowded():
                self._quiet(lane, spent)  # the dying process holds the memory this one needs
            if self._warmer is not None:  # its kernels warming ahead: take them from the store
                warming = time.perf_counter()
                self._warmer.wait(candidate.id, self.config.timeout_s)
                spent["warm_wait_s"] = time.perf_counter() - warming
            # the time limit starts here, and stops while the judge waits for the others
            # (``_quiet``): an earlier candidate's slow death is not this one's
            deadline = time.monotonic() + self.config.timeout_s
            loading = time.perf_counter()
            handle.trusted = self.triton_store is not None and self.triton_store.trusts(candidate)
            try:
                reply = self.judge.ask(handle, deadline, "load", "build",
                                       **self._load_fields(candidate, cubin))
            except Verdict as failed:
                status: Status = failed.status
                if status is Status.RUNTIME_ERROR:
                    status = Status.BUILD_FAILED
                return verdict(status, _first_lines(failed.message), log=_tail(handle, failed.message))
            if reply.get("status"):
                status, message = _load_status(reply["status"], str(reply.get("message", "")))
                return verdict(status, _first_lines(message),
                               log=_tail(handle, message), resources=resources)
            resources |= {k: v for k, v in _resources(reply.get("resources")).items()
                          if k not in resources}
            spent["load_s"] = time.perf_counter() - loading
            self.judge.begin()
            later = Deferred()
            for shape in shapes:
                mapping = time.perf_counter()
                if later and (shape not in self._bank_store or later.nbytes() > DEFER_BYTES):
                    # a new bank can evict one whose answers wait; or they take too much
                    results = self._settle(later, results, spent)
                    if results and results[-1].status is not Status.PASSED:
                        break
                if shape not in self._bank_store:
                    # making a bank waits for every lane's retiring (``bank``): an earlier
                    # candidate's death, which this one's time limit does not count
                    deadline += self._quiet(lane, spent)
                bank = self.bank(shape, lane)
                try:
                    handle.map(self._bank_store.chunks(lane))
                except (CandidateFault, ChannelClosed, ChannelTimeout, ProtocolError) as exc:
                    results.append(ShapeResult(
                        shape=shape, status=Status.RUNTIME_ERROR,
                        message=f"the candidate's process failed between shapes: {exc}"))
                    break
                spent["map_s"] = spent.get("map_s", 0.0) + time.perf_counter() - mapping
                quiet_before = spent.get("quiet_wait_s", 0.0)
                result, seconds = self.judge.judge_shape(
                    handle, bank, rng, deadline, later if self.config.overlap_checks else None,
                    quiet=lambda eager: self._quiet(lane, spent, eager),
                    checked_later=bool(results))
                # neither the time limit nor the device seconds a search spends count the
                # wait for an earlier candidate's death
                waited = spent.get("quiet_wait_s", 0.0) - quiet_before
                deadline += waited
                device_s += max(0.0, seconds - waited)
                result = result.model_copy(update={
                    "reference": reference.get(shape), "baseline": self.baseline.kind,
                })
                results.append(result)
                if result.status is not Status.PASSED:
                    break  # a failure is final: spend no more device time on this candidate
            # the process is done with: while it flushes its CUPTI records and, the moment
            # they are in, is killed and its chunks scrubbed (in the background), the judge
            # checks the answers it kept (its own copies, against its own inputs and
            # expected outputs)
            if self.config.quiet_graphs:
                self._refill(lane)  # nothing of this candidate is clocked any more
            collect = self.judge.start_collect(handle, deadline)
            if self.config.collect_first:
                # the records first, with nothing else on the device; then the kill
                # overlaps the checks alone
                _read_records(collect, spent)
            retiring = time.perf_counter()
            received = self._retire_behind(
                handle, lane, None if self.config.collect_first else collect)
            retired = True
            spent["retire_s"] = time.perf_counter() - retiring
            # the next candidate may take its process, load and make its untimed calls
            # while these checks run; it is clocked only once they are over (``_quiet``)
            with self._settling.running():
                turn.release()
                results = self._settle(later, results, spent)
                waiting = time.perf_counter()
                received.wait()
                spent["cupti_wait_s"] = time.perf_counter() - waiting
                results = collect.apply(results)
        finally:
            if not retired:  # an error left before the process was retired
                retiring = time.perf_counter()
                self._retire_behind(handle, lane)
                spent["retire_s"] = time.perf_counter() - retiring
                if self.config.quiet_graphs:
                    self._refill(lane)  # as it would have before the retiring
        worst = min((r.status for r in results), key=lambda s: s.rank, default=Status.PASSED)
        status = Status.PASSED if results and all(r.status is Status.PASSED for r in results) else worst
        return verdict(status, _feedback(results), shapes=tuple(results), resources=resources,
                       device_s=device_s, log=_tail(handle, ""), overheads=spent)

    def _settle(self, later: Deferred, results: list[ShapeResult],
                spent: dict[str, float]) -> list[ShapeResult]:
        """``Judge.settle``, its time charged to ``deferred_checks_s``."""
        started = time.perf_counter()
        try:
            return self.judge.settle(later, results)
        finally:
            spent["deferred_checks_s"] = (spent.get("deferred_checks_s", 0.0)
                                          + time.perf_counter() - started)

    def close(self) -> None:
        for lane in self._lanes:
            with contextlib.suppress(RuntimeError):
                lane.await_retired()
            lane.pool.close()
        if self._prebuilder is not None:
            self._prebuilder.close()
            self._prebuilder = None
        if self._warmer is not None:
            self._warmer.close()
            self._warmer = None
        self._supply.close()
        self._bank_store.close()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # what the banks held, for whatever runs next here

    def __enter__(self) -> SandboxEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _HeadTurn:
    """One evaluation's hold of ``SandboxEvaluator._head`` (taken when made), given up
    once: as its checks begin (the next candidate may start) or when it ends."""

    def __init__(self, lock: threading.Lock) -> None:
        started = time.perf_counter()
        lock.acquire()
        self.waited_s = time.perf_counter() - started
        self._lock: threading.Lock | None = lock
        self.handle: CandidateHandle | None = None
        """The process the candidate was loaded into, once taken."""

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()


def _read_records(collect: CuptiCollect, spent: dict[str, float]) -> None:
    """``collect.receive()``, its seconds charged to ``cupti_collect_s`` and the process's
    own flush seconds to ``cupti_flush_s``. A failure here is a bug of the judge's: the
    CUPTI figures are lost (logged), nothing else."""
    started = time.perf_counter()
    try:
        collect.receive()
    except Exception:
        log.exception("reading a candidate process's CUPTI records failed")
    finally:
        spent["cupti_collect_s"] = time.perf_counter() - started
        if collect.flush_s is not None:
            spent["cupti_flush_s"] = collect.flush_s


LOAD_STATUSES = (Status.BUILD_FAILED, Status.SKIPPED)
"""The statuses a candidate's process may name in its reply to ``load`` (its build
failed; a CUDA or Triton candidate on a machine with no GPU). The reply is the process's,
and the process is the candidate's: any other status, PASSED included, is not taken."""


def _load_status(named: Any, message: str) -> tuple[Status, str]:
    """The status a reply to ``load`` named and its message, where a process may name
    it; else BUILD_FAILED, saying so (a candidate that rewrote its process's reply to say
    PASSED made the judge's evaluation raise: red team 8's ``forges_load_status.py``)."""
    for status in LOAD_STATUSES:
        if named == status.value:
            return status, message
    allowed = " or ".join(s.value for s in LOAD_STATUSES)
    return Status.BUILD_FAILED, (f"the candidate's process named the status {str(named)[:40]!r} "
                                 f"in its reply to load, where only {allowed} may be named")


def _resources(reported: Any) -> dict[str, float]:
    """The build's facts a reply to ``load`` reported: finite numbers by name, nothing
    else (the reply is the candidate's process's)."""
    if not isinstance(reported, dict):
        return {}
    return {str(k)[:100]: float(v) for k, v in list(reported.items())[:100]
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


FEEDBACK_CHARS = 8192
"""Most characters of a message that go into feedback: a candidate's process can raise
an error of tens of MB (one line), which would reach every record and prompt."""


def _first_lines(text: str, n: int = 25) -> str:
    lines = text.strip().splitlines()
    found = "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")
    return found if len(found) <= FEEDBACK_CHARS else found[:FEEDBACK_CHARS] + " ..."


def _tail(handle: CandidateHandle, message: str) -> str:
    return (handle.log_tail() + ("\n" + message if message else "")).strip()[-_LOG_LIMIT:]


def _feedback(results: Sequence[ShapeResult]) -> str:
    failed = [r for r in results if r.status is not Status.PASSED]
    if failed:
        first = failed[0]
        return f"{first.status.value} on shape {first.shape}: {_first_lines(first.message, 12)}"
    parts = [f"{r.shape[:8]}: {r.timing.median_ms * 1e3:.1f} us"
             for r in results if r.timing is not None]
    return "all shapes passed; latency " + ", ".join(parts)
