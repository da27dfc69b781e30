"""The sandbox evaluator: untrusted candidates judged in confined processes.

``SandboxEvaluator`` is the evaluator a search uses on a GPU or a CPU. Its own
process is the judge: it makes every input, computes every expected output with
the workload's reference, owns the shared memory, keeps the clock, checks and
writes the verdict. A candidate's build, host code and kernels run only in a
process of their own (candidate_main.py), confined (isolation.py), reached through
one socket, and killed with everything it started when its evaluation ends. CUDA
sources are compiled in confined compiler processes (prebuild.py), whose binaries
only this process stores.

Per candidate: static screen (advisory by default it rejects; the runtime boundary is
the defence) -> a spare process -> build (``load``) -> per shape, the judge's cascade
(judge.py) -> the process is killed. The baseline (baseline.py) is timed once per
shape per run by the same judge, and attached to every shape result.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import secrets
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from evokernel.candidate import Candidate, Language
from evokernel.evaluate.bank import BankConfig, ShapeBank, derived_seed
from evokernel.evaluate.baseline import Baseline, TimingStore, choose
from evokernel.evaluate.build import arch_for_capability
from evokernel.evaluate.channel import ChannelClosed, ChannelTimeout, ProtocolError
from evokernel.evaluate.environment import fingerprint
from evokernel.evaluate.isolation import Isolation, probe
from evokernel.evaluate.judge import SIZING_BATCHES, Deferred, Judge, JudgeConfig, Verdict
from evokernel.evaluate.options import PEAK_BANDWIDTH_GBPS, SandboxConfig, detect_device
from evokernel.evaluate.prebuild import Prebuilder
from evokernel.evaluate.process import CandidateFault, CandidateHandle, SparePool
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.evaluate.shared import Chunk
from evokernel.evaluate.static import policy_rules, static_violations
from evokernel.workload import Workload, load_workload

log = logging.getLogger(__name__)

__all__ = ["SandboxConfig", "SandboxEvaluator", "detect_device"]

_LOG_LIMIT = 64 * 1024
DEFER_BYTES = 1 << 30
"""Most memory the copies kept for one candidate's deferred checks may take: past it, they
are checked before the next shape (``Judge.settle``)."""

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
        self._retiring: threading.Thread | None = None
        """The last candidate's process being killed and its chunks scrubbed, in the
        background while the next process is readied; joined before any candidate code
        loads (``_await_retired``)."""
        self._retire_failure: BaseException | None = None
        self._outlived = False
        """A used process outlived its kill: its chunks must not serve anyone again."""
        self._banks: OrderedDict[str, ShapeBank] = OrderedDict()
        self._chunk_ids = 0
        self._baseline_path = self.config.baseline_cache or self.work_dir / "baseline_timings.json"
        self._baseline_store = TimingStore(self._baseline_path)
        self._environment: dict[str, str] | None = None
        self._prebuilder: Prebuilder | None = None
        self._counter = 0
        self._build_cache = self.config.build_cache or self.work_dir / "builds"
        cores = os.cpu_count() or 2
        spares = self.config.spares if self.config.spares is not None else (
            min(8, max(2, cores // 2)) if gpu else 1)
        self._pool = SparePool(spares, self._start_process, self._chunks, self._slots)

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

    def _start_process(self, tag: str) -> CandidateHandle:
        return CandidateHandle(self.config.device, self.isolation,
                               self.work_dir / "logs" / f"{tag}.log", self.config.cpu_threads)

    def _fresh_process(self, attempts: int = 3, calibrate: bool = True) -> CandidateHandle:
        """A started process with every chunk mapped and (with ``calibrate``) its round
        trip calibrated, before any candidate code is loaded into it. Calibrate only once
        no earlier process is being retired (``_calibrated``)."""
        problem: Exception | None = None
        for _ in range(attempts):
            handle = self._pool.take()
            try:
                handle.map(self._chunks())
                if calibrate:
                    self._calibrate(handle)
                return handle
            except (CandidateFault, ChannelClosed, ChannelTimeout, ProtocolError) as exc:
                problem = exc
                log.warning("a started candidate process failed before use: %s", exc)
                handle.kill()
        raise RuntimeError(f"no candidate process could be started: {problem}")

    def _calibrate(self, handle: CandidateHandle) -> None:
        """The round trip every timed batch subtracts, measured as a batch sees it. Called
        with no earlier process dying and no scrub running: a used process killed in the
        background (its device context torn down, its kernels stopped) or the judge's own
        scrub would lengthen it, and each timed batch of the next candidate would then
        be shortened by that much (a candidate could leave its device busy to do it)."""
        handle.calibrate(self.judge.before_batch)
        if self.device.type == "cuda" and self.judge.least_span_s is None:
            self.judge.least_span_s = handle.least_span_s()

    def _calibrated(self, handle: CandidateHandle) -> CandidateHandle:
        """``handle`` calibrated, or another fresh process where it failed (a spare can die
        while it waits)."""
        try:
            self._calibrate(handle)
            return handle
        except (CandidateFault, ChannelClosed, ChannelTimeout, ProtocolError) as exc:
            log.warning("a started candidate process failed before use: %s", exc)
            handle.kill()
            return self._fresh_process()

    def _retire(self, handle: CandidateHandle) -> None:
        """Kill a used process (returns once everything it started is gone), then scrub
        every shared chunk it could reach, so nothing it left reaches the next one. If a
        process outlives its kill, a scrub proves nothing (it can write again after it):
        every bank is dropped instead, before the next candidate's (``_await_retired``)."""
        if not handle.kill():
            log.error("a used candidate process outlived its kill; the shared chunks it "
                      "mapped are dropped, and every shape's slots are made anew")
            self._outlived = True
            return
        with self._lock:
            banks = list(self._banks.values())
        for bank in banks:
            bank.scrub()

    def _retire_behind(self, handle: CandidateHandle) -> None:
        """``_retire`` in the background: the next process's start, mapping and round-trip
        calibration (no candidate code in any of it) overlap the kill."""
        self._await_retired()

        def work() -> None:
            try:
                self._retire(handle)
            except BaseException as exc:  # joined and raised before the next load
                self._retire_failure = exc

        self._retiring = threading.Thread(target=work, name="retire", daemon=True)
        self._retiring.start()

    def wait_retired(self) -> None:
        """Return once the last evaluated candidate's process and everything it started
        are gone. ``evaluate`` returns before that (the kill overlaps the next
        candidate's start); the next ``evaluate`` and ``close`` wait for it."""
        self._await_retired()

    def _await_retired(self) -> None:
        """Return once the last process is gone and its chunks scrubbed; raise if that
        failed (then no other candidate may use the chunks)."""
        if self._retiring is not None:
            self._retiring.join()
            self._retiring = None
        if self._outlived:
            self._outlived = False
            self._drop_banks()
        if self._retire_failure is not None:
            failure, self._retire_failure = self._retire_failure, None
            raise RuntimeError(f"scrubbing after a candidate failed: {failure}") from failure

    def _judge_rng(self, candidate_id: str, counter: int) -> random.Random:
        """The judge's choices for one evaluation (checked slots, variant order, the
        sample of each batch). Salted like the inputs: from the run seed (public), the
        candidate's id (its process can read it) and the evaluation's number (a few
        guesses, told apart by the trials' slots) alone, a candidate could replay them
        and fake exactly the calls that go unchecked."""
        return random.Random(derived_seed(self.config.seed, self._salt, candidate_id, counter))

    def _drop_banks(self) -> None:
        """Close every bank (the next use of a shape makes it anew, in new chunks)."""
        with self._lock:
            banks = list(self._banks.values())
            self._banks.clear()
        for bank in banks:
            bank.close()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _slots(self) -> dict[str, list[list[Any]]]:
        with self._lock:
            return {shape: bank.slots_json for shape, bank in self._banks.items()}

    def _chunks(self) -> dict[int, tuple[Chunk, bool]]:
        with self._lock:
            return {i: c for bank in self._banks.values() for i, c in bank.chunks.items()}

    def bank(self, shape: str) -> ShapeBank:
        """The judge's inputs for a shape (made once; the least recent dropped past the budget)."""
        with self._lock:
            if shape in self._banks:
                self._banks.move_to_end(shape)
                return self._banks[shape]
        self._await_retired()  # a new bank can drop an old one: never under a running scrub
        with self._lock:
            self._chunk_ids += 2  # inputs and outputs
            chunk_id = self._chunk_ids
        gpu = self.device.type == "cuda"
        budget = self.config.bank_memory_gb or (48.0 if gpu else 4.0)
        config = BankConfig(seed=self.config.seed, salt=self._salt, bases=self.config.bases,
                            slots=self.config.slots or (256 if gpu else 64),
                            trials=self.config.trials,
                            batches=self.config.batches,
                            sizing_batches=SIZING_BATCHES + 1,  # and a graph replay
                            cupti_calls=self.config.cupti_calls if gpu else 0,
                            memory_bytes=int(min(2.0, budget / 4) * (1 << 30)))
        bank = ShapeBank(self.workload, shape, config, self.device, self.workload.expected_outputs,
                         chunk_id)
        bank.warm(16 if gpu else 2)
        if gpu:  # on the CPU, making them as they are needed costs less than all at once
            bank.make_variants()
        evicted = False
        with self._lock:
            self._banks[shape] = bank
            while len(self._banks) > 1 and self._bank_bytes() > budget * (1 << 30):
                _, old = self._banks.popitem(last=False)
                old.close()
                evicted = True
        if evicted and gpu:
            torch.cuda.empty_cache()  # or the caching allocator keeps what the bank held
        return bank

    def _bank_bytes(self) -> int:
        return sum(b.nbytes() for b in self._banks.values())

    # -- environment and baseline ----------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """What a timing depends on besides the kernel, and how candidates were confined."""
        if self._environment is None:
            env = fingerprint(self.device)
            env["sandbox"] = self.isolation.describe()
            env["baseline"] = f"{self.baseline.kind} ({self.baseline.origin})"
            self._environment = env
        return self._environment

    def _baseline_key(self, shape: str) -> str:
        env = json.dumps({k: v for k, v in self.environment().items() if k != "sandbox"},
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
        self._pool.ready()
        return timings

    def baseline_timings(self, shapes: Sequence[str]) -> dict[str, Timing]:
        """The baseline's timing per shape: measured once per run (and cached on disk)."""
        return self._baseline_store.get(shapes, self._baseline_key, self._time_baseline)

    def _time_baseline(self, shapes: Sequence[str]) -> dict[str, Timing]:
        self._await_retired()  # banks may be made or dropped here: no scrub may be running
        handle = self._fresh_process()
        try:
            deadline = time.monotonic() + max(self.config.timeout_s, 600.0) * len(shapes)
            reply = handle.request("load", 120.0, reference=self.baseline.source,
                                   input_count=len(self.workload.input_names))
            if "error" in reply:
                raise RuntimeError(f"the {self.baseline.kind} reference does not load: {reply['error']}")
            results = []
            self.judge.begin()
            for shape in shapes:
                bank = self.bank(shape)
                handle.map(self._chunks())
                result, _ = self.judge.judge_shape(handle, bank, random.Random(0), deadline)
                if result.status is not Status.PASSED or result.timing is None:
                    raise RuntimeError(
                        f"the {self.baseline.kind} reference ({self.baseline.origin}) fails the "
                        f"workload's own check on shape {shape}: {result.message[:500]}"
                    )
                results.append(result)
            results = self.judge.collect_cupti(handle, results, deadline)
            return {r.shape: r.timing for r in results if r.timing is not None}
        finally:
            self._retire(handle)

    # -- building ahead ------------------------------------------------------------------

    def prebuild_workers(self) -> int:
        """How many processes build ahead (the configured number, or the device default)."""
        workers = self.config.prebuild_workers
        if workers is None:
            cores = os.cpu_count() or 2
            workers = min(4, max(1, cores // 4)) if self.device.type == "cuda" else 0
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

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Start compiling these candidates' CUDA sources and starting processes; returns at once."""
        self._pool.fill()
        if self.prebuild_workers() == 0:
            return
        screened = [c for c in candidates if c.workload == self.workload.name
                    and not static_violations(c, self.workload, self.config.policies)]
        if screened:
            self._builder().submit(screened)

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
        with self._lock:
            self._counter += 1
            counter = self._counter
        handle = self._fresh_process(calibrate=False)  # overlaps the last one's retiring
        spent = {"process_wait_s": time.perf_counter() - started}
        results: list[ShapeResult] = []
        device_s = 0.0
        retired = False
        rng = self._judge_rng(candidate.id, counter)
        try:
            waiting = time.perf_counter()
            self._await_retired()  # the last candidate's leftovers are gone before this loads
            spent["retire_wait_s"] = time.perf_counter() - waiting
            handle = self._calibrated(handle)  # nothing else on the device now
            spent["calibrate_s"] = time.perf_counter() - waiting - spent["retire_wait_s"]
            # the time limit starts here: the last candidate's slow death is not this one's
            deadline = time.monotonic() + self.config.timeout_s
            arch = None
            if self.device.type == "cuda":
                arch = arch_for_capability(*torch.cuda.get_device_capability(self.device))
            loading = time.perf_counter()
            try:
                reply = self.judge.ask(
                    handle, deadline, "load", "build", candidate=candidate.model_dump(mode="json"),
                    arguments=[*self.workload.input_names, *self.workload.output_names], arch=arch,
                    cubin=base64.b64encode(cubin).decode() if cubin else None,
                    threads=self.config.cpu_threads,
                )
            except Verdict as failed:
                status: Status = failed.status
                if status is Status.RUNTIME_ERROR:
                    status = Status.BUILD_FAILED
                return verdict(status, _first_lines(failed.message), log=_tail(handle, failed.message))
            if reply.get("status"):
                message = str(reply.get("message", ""))
                return verdict(Status(reply["status"]), _first_lines(message),
                               log=_tail(handle, message), resources=resources)
            resources |= {k: float(v) for k, v in reply.get("resources", {}).items()
                          if isinstance(v, int | float) and k not in resources}
            spent["load_s"] = time.perf_counter() - loading
            self.judge.begin()
            later = Deferred()
            for shape in shapes:
                mapping = time.perf_counter()
                if later and (not self._has_bank(shape) or later.nbytes() > DEFER_BYTES):
                    # a new bank can evict one whose answers wait; or they take too much
                    results = self._settle(later, results, spent)
                    if results and results[-1].status is not Status.PASSED:
                        break
                bank = self.bank(shape)
                try:
                    handle.map(self._chunks())
                except (CandidateFault, ChannelClosed, ChannelTimeout, ProtocolError) as exc:
                    results.append(ShapeResult(
                        shape=shape, status=Status.RUNTIME_ERROR,
                        message=f"the candidate's process failed between shapes: {exc}"))
                    break
                spent["map_s"] = spent.get("map_s", 0.0) + time.perf_counter() - mapping
                result, seconds = self.judge.judge_shape(
                    handle, bank, rng, deadline, later if self.config.overlap_checks else None)
                device_s += seconds
                result = result.model_copy(update={
                    "reference": reference.get(shape), "baseline": self.baseline.kind,
                })
                results.append(result)
                if result.status is not Status.PASSED:
                    break  # a failure is final: spend no more device time on this candidate
            # the process is done with: while it flushes its CUPTI records and, once they
            # are in, is killed and its chunks scrubbed, the judge checks the answers it
            # kept (its own copies, against its own inputs and expected outputs)
            collect = self.judge.start_collect(handle, deadline)

            def release() -> None:
                nonlocal retired
                if retired:
                    return
                waiting = time.perf_counter()
                collect.receive()
                spent["cupti_collect_s"] = time.perf_counter() - waiting
                retired = True
                retiring = time.perf_counter()
                self._retire_behind(handle)
                spent["retire_s"] = time.perf_counter() - retiring

            def between() -> None:
                if collect.answered():
                    release()

            results = self._settle(later, results, spent, between)
            release()
            results = collect.apply(results)
        finally:
            if not retired:
                retiring = time.perf_counter()
                self._retire_behind(handle)
                spent["retire_s"] = time.perf_counter() - retiring
        worst = min((r.status for r in results), key=lambda s: s.rank, default=Status.PASSED)
        status = Status.PASSED if results and all(r.status is Status.PASSED for r in results) else worst
        return verdict(status, _feedback(results), shapes=tuple(results), resources=resources,
                       device_s=device_s, log=_tail(handle, ""), overheads=spent)

    def _has_bank(self, shape: str) -> bool:
        with self._lock:
            return shape in self._banks

    def _settle(self, later: Deferred, results: list[ShapeResult], spent: dict[str, float],
                between: Callable[[], None] | None = None) -> list[ShapeResult]:
        """``Judge.settle``, its time charged to ``deferred_checks_s``."""
        started = time.perf_counter()
        try:
            return self.judge.settle(later, results, between)
        finally:
            spent["deferred_checks_s"] = (spent.get("deferred_checks_s", 0.0)
                                          + time.perf_counter() - started)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._await_retired()
        self._pool.close()
        if self._prebuilder is not None:
            self._prebuilder.close()
            self._prebuilder = None
        with self._lock:
            for bank in self._banks.values():
                bank.close()
            self._banks.clear()

    def __enter__(self) -> SandboxEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_lines(text: str, n: int = 25) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")


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
