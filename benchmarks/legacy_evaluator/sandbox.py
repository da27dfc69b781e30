"""Isolated evaluation: one fresh process per candidate, with a time limit.

The parent never imports a candidate. It writes a job file, hands it to a worker
process (started ahead of time, torch already imported), waits up to the time
limit, and reads the result file. A crash, a hang, an exit or a poisoned CUDA
context becomes a status; the run goes on with a new process.

The worker's environment has no secrets (variables that look like keys, tokens or
passwords are removed), it has no network (a namespace of its own, where ``unshare``
works), a CPU worker has an address-space limit, and its working directory is a
scratch folder of its own.
The reference's latency per shape is measured once, in the same kind of process,
and cached on disk keyed by the environment and the reference's source.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.legacy_evaluator.prebuild import Prebuilder
from benchmarks.legacy_evaluator.timing import TimingConfig
from evokernel.candidate import Candidate
from evokernel.evaluate.build import arch_for_capability
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.evaluate.static import policy_rules, static_violations
from evokernel.workload import Workload, load_workload, workloads_root

_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_LOG_LIMIT = 64 * 1024

def clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without anything that looks like a secret."""
    env = {k: v for k, v in os.environ.items() if not _SECRET.search(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def detect_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


@functools.cache
def network_isolation_prefix() -> tuple[str, ...]:
    """``unshare --net`` where it works here: the worker then has no network at all."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    try:
        ok = subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (unshare, "--net") if ok else ()


def _limit_memory(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


@dataclass
class SandboxConfig:
    device: str = "auto"
    timeout_s: float = 300.0
    isolate_network: bool = True
    """Run workers in a network namespace of their own (where ``unshare`` allows it)."""
    cpu_memory_gb: float = 8.0
    """Address-space limit of a CPU worker. Not applied on a GPU: CUDA maps far more
    virtual memory than it uses, and the device's own allocator bounds device memory."""
    seed: int = 0
    trials: int = 3
    timing: TimingConfig = field(default_factory=TimingConfig)
    cpu_threads: int = 1
    peak_bandwidth_gbps: float | None = None
    """Bandwidth for the speed-of-light bound; None: the device's datasheet figure."""
    policies: tuple[str, ...] = ()
    """Optional rule sets of the workload to enforce (e.g. ``no_library_topk``)."""
    reference_cache: Path | None = None
    """JSON file of reference latencies; default: <work_dir>/reference_timings.json."""
    build_cache: Path | None = None
    """Folder of compiled kernels shared by the workers; default: <work_dir>/builds."""
    prebuild_workers: int | None = None
    """Processes compiling queued CUDA candidates ahead of their evaluation. None: 2 on a
    GPU, 0 on the CPU, where the compiles would share the cores that time candidates."""


class _Worker:
    """One started worker process waiting for its job."""

    def __init__(self, env: dict[str, str], log_path: Path, config: SandboxConfig) -> None:
        self.log_path = log_path
        self.log = log_path.open("wb")
        prefix = network_isolation_prefix() if config.isolate_network else ()
        limit = None
        if config.device == "cpu" and config.cpu_memory_gb > 0:
            limit = _limit_memory(int(config.cpu_memory_gb * (1 << 30)))
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "benchmarks.legacy_evaluator.worker"],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, preexec_fn=limit,
        )

    def run(self, job_path: Path, timeout_s: float) -> tuple[int | None, float]:
        """Hand over the job; the exit code (None on timeout) and the seconds it took."""
        started = time.perf_counter()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{job_path}\n".encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            code: int | None = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        return code, time.perf_counter() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # children it left behind
        self.log.close()

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-_LOG_LIMIT:].decode(errors="replace")


class SandboxEvaluator:
    """Evaluates candidates in isolated processes on the GPU or the CPU."""

    def __init__(
        self,
        workload_name: str,
        *,
        device: str = "auto",
        timeout_s: float = 300.0,
        work_dir: Path | None = None,
        prebuild_workers: int | None = None,
        config: SandboxConfig | None = None,
    ) -> None:
        self.config = config or SandboxConfig(
            device=device, timeout_s=timeout_s, prebuild_workers=prebuild_workers
        )
        if self.config.device == "auto":
            self.config.device = detect_device()
        self.workload: Workload = load_workload(workload_name)
        policy_rules(self.workload, self.config.policies)  # unknown names fail here, not later
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="evokernel-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._env = clean_environment()
        self._lock = threading.Lock()
        self._spare: _Worker | None = None
        self._counter = 0
        self._reference: dict[str, Timing] = {}
        self._reference_path = self.config.reference_cache or self.work_dir / "reference_timings.json"
        self._environment: dict[str, str] | None = None
        self._build_cache = self.config.build_cache or self.work_dir / "builds"
        self._prebuilder: Prebuilder | None = None

    # -- processes ----------------------------------------------------------------------

    def _new_worker(self, tag: str) -> _Worker:
        return _Worker(self._env, self.work_dir / "logs" / f"{tag}.log", self.config)

    def _take_worker(self, tag: str) -> _Worker:
        (self.work_dir / "logs").mkdir(exist_ok=True)
        worker = self._spare if self._spare is not None else self._new_worker(tag)
        if worker.log_path.name != f"{tag}.log":
            target = self.work_dir / "logs" / f"{tag}.log"
            os.replace(worker.log_path, target)
            worker.log_path = target
        self._spare = self._new_worker(f"spare-{self._counter + 1}")
        return worker

    def _run_job(self, job: dict[str, Any], tag: str) -> tuple[dict[str, Any] | None, str, int | None]:
        """Run one job; (result or None, log tail, exit code or None for timeout)."""
        self._counter += 1
        (self.work_dir / "jobs").mkdir(exist_ok=True)
        job_dir = Path(tempfile.mkdtemp(prefix=f"{self._counter:05d}-{tag}-", dir=self.work_dir / "jobs"))
        scratch = job_dir / "scratch"
        scratch.mkdir()
        result_path = job_dir / "result.json"
        job = {
            **job,
            "workload": self.workload.name,
            "workloads_root": str(workloads_root()),
            "device": self.config.device,
            "seed": self.config.seed,
            "trials": self.config.trials,
            "timing": asdict(self.config.timing),
            "cpu_threads": self.config.cpu_threads,
            "peak_bandwidth_gbps": self.config.peak_bandwidth_gbps,
            "environment": self._environment,
            "build_cache": str(self._build_cache),
            "scratch": str(scratch),
            "result": str(result_path),
        }
        job_path = job_dir / "job.json"
        job_path.write_text(json.dumps(job))
        worker = self._take_worker(f"{self._counter:05d}-{tag}")
        code, _ = worker.run(job_path, self.config.timeout_s)
        tail = worker.log_tail()
        # The candidate can reach this path: trust only a regular file of sane size.
        try:
            st = os.lstat(result_path)
        except OSError:
            return None, tail, code
        if code is None or not stat.S_ISREG(st.st_mode) or st.st_size > 64 * 2**20:
            return None, tail, code
        try:
            result = json.loads(result_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None, tail, code
        return (result, tail, code) if isinstance(result, dict) else (None, tail, code)

    # -- reference ----------------------------------------------------------------------

    def _reference_key(self, shape: str) -> str:
        src = hashlib.sha256(self.workload.reference_source.encode()).hexdigest()[:12]
        env = json.dumps(self.environment(), sort_keys=True)
        digest = hashlib.sha256(env.encode()).hexdigest()[:12]
        return f"{self.workload.name}:{src}:{digest}:{self.config.seed}:{shape}"

    def environment(self) -> dict[str, str]:
        """Fingerprint of the evaluation device (measured in a worker, once)."""
        if self._environment is None:
            result, tail, _ = self._run_job({"mode": "environment"}, "environment")
            if result is None or "environment" not in result:
                raise RuntimeError(f"the evaluation worker failed to start:\n{tail[-2000:]}")
            self._environment = dict(result["environment"])
        return self._environment

    def reference_timings(self, shapes: Sequence[str]) -> dict[str, Timing]:
        """Reference latency per shape, measured once per environment and cached on disk."""
        cached: dict[str, Any] = {}
        if self._reference_path.exists():
            try:
                cached = json.loads(self._reference_path.read_text())
            except json.JSONDecodeError:
                cached = {}
        missing = []
        for shape in shapes:
            key = self._reference_key(shape)
            if shape in self._reference:
                continue
            if key in cached:
                self._reference[shape] = Timing.model_validate(cached[key])
            else:
                missing.append(shape)
        if missing:
            result, tail, code = self._run_job({"mode": "reference", "shapes": missing}, "reference")
            if result is None or "reference" not in result:
                why = "timed out" if code is None else f"exited with {code}"
                raise RuntimeError(f"timing the reference {why}:\n{(result or {}).get('error', tail)[-3000:]}")
            for shape, timing in result["reference"].items():
                self._reference[shape] = Timing.model_validate(timing)
                cached[self._reference_key(shape)] = timing
            tmp = self._reference_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
            os.replace(tmp, self._reference_path)
        return {s: self._reference[s] for s in shapes}

    # -- building ahead -----------------------------------------------------------------

    def prebuild_workers(self) -> int:
        """How many processes build ahead (the configured number, or the device default)."""
        workers = self.config.prebuild_workers
        if workers is None:
            workers = 2 if self.config.device.startswith("cuda") else 0
        return max(0, workers)

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Start compiling these candidates' CUDA sources; evaluating them later is faster.

        Returns at once. Candidates that fail the static screen are not compiled.
        """
        workers = self.prebuild_workers()
        if workers == 0:
            return
        screened = [c for c in candidates if c.workload == self.workload.name
                    and not static_violations(c, self.workload, self.config.policies)]
        if not screened:
            return
        with self._lock:
            if self._prebuilder is None:
                if self.config.device.startswith("cuda"):
                    major, minor = (int(x) for x in self.environment()["capability"].split("."))
                    compiler, arch = "nvrtc", arch_for_capability(major, minor)
                else:
                    compiler, arch = "nvcc", "sm_90a"  # what a CPU evaluation checks
                prefix = network_isolation_prefix() if self.config.isolate_network else ()
                self._prebuilder = Prebuilder(
                    self._build_cache, compiler=compiler, arch=arch, workers=workers,
                    env=self._env, timeout_s=self.config.timeout_s, prefix=prefix,
                )
            self._prebuilder.submit(screened)

    def wait_for_builds(self, timeout_s: float) -> bool:
        """Block until the compiles started by ``prepare`` are over (benchmarks, tests)."""
        return self._prebuilder is None or self._prebuilder.idle(timeout_s)

    # -- the Evaluator protocol ---------------------------------------------------------

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        with self._lock:
            return self._evaluate(candidate, list(shapes))

    def _evaluate(self, candidate: Candidate, shapes: list[str]) -> Evaluation:
        started = time.perf_counter()
        if candidate.workload != self.workload.name:
            return Evaluation(
                candidate_id=candidate.id, status=Status.REJECTED,
                feedback=f"candidate is for workload {candidate.workload!r}, not {self.workload.name!r}",
            )
        violations = static_violations(candidate, self.workload, self.config.policies)
        if violations:
            return Evaluation(
                candidate_id=candidate.id, status=Status.REJECTED,
                feedback="; ".join(violations), environment=self.environment(),
            )
        reference = self.reference_timings(shapes)
        if self._prebuilder is not None:  # a compile of this one under way: let it land
            self._prebuilder.wait(candidate.id, self.config.timeout_s)
        job = {"mode": "candidate", "candidate": candidate.model_dump(mode="json"), "shapes": shapes}
        result, tail, code = self._run_job(job, candidate.id)
        elapsed = time.perf_counter() - started
        env = self.environment()
        if result is None:
            if code is None:
                status, what = Status.TIMEOUT, f"no result within {self.config.timeout_s:.0f} s"
            else:
                status, what = Status.RUNTIME_ERROR, f"the worker process died (exit code {code})"
            return Evaluation(
                candidate_id=candidate.id, status=status, environment=env, wall_s=elapsed,
                device_s=elapsed, feedback=f"{what}; last output:\n{tail[-1500:]}", log=tail,
            )
        try:
            if "error" in result:
                error = str(result["error"])
                return Evaluation(
                    candidate_id=candidate.id, status=Status.RUNTIME_ERROR, environment=env,
                    wall_s=elapsed, feedback=error[-1500:], log=tail + error,
                )
            evaluation = Evaluation.model_validate(result["evaluation"])
        except (KeyError, ValueError, TypeError) as exc:  # a malformed result is a fault, never a crash
            return Evaluation(
                candidate_id=candidate.id, status=Status.RUNTIME_ERROR, environment=env,
                wall_s=elapsed, feedback=f"unreadable result from the worker: {type(exc).__name__}",
                log=tail,
            )
        shapes_with_reference = tuple(
            ShapeResult.model_validate({**s.model_dump(), "reference": reference.get(s.shape)})
            for s in evaluation.shapes
        )
        log = (evaluation.log + "\n" + tail).strip()[-_LOG_LIMIT:]
        return evaluation.model_copy(
            update={"shapes": shapes_with_reference, "log": log, "wall_s": elapsed}
        )

    def close(self) -> None:
        if self._prebuilder is not None:
            self._prebuilder.close()
            self._prebuilder = None
        if self._spare is not None:
            self._spare.kill()
            self._spare = None

    def __enter__(self) -> SandboxEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
