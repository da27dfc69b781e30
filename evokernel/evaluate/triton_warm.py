"""A trusted candidate's Triton kernels compiled ahead of its evaluation, into the store.

A Triton candidate compiles its kernels on its first calls, in its own process, while the
judge waits: 2-6 s a point of a dsa_sparse_attention landscape for ``triton_split``, 10-40 s
for fused_moe's ``triton_fused`` (H100, 2026-12-08, ``phase_checked_calls_ms``). The store
(triton_store.py) spares a variant the kernels an earlier process of the same seed built,
not the ones its own knobs change. This module builds those ahead, on idle CPU cores, while
the device times the candidate before: for each candidate the runtime hands to ``prepare``
that the store ``trusts`` (a shipped seed's exact code) and that is written in Triton, a
warming process (a candidate process kept for warming only) loads it and calls it once per
shape on *meta* tensors of the shape's argument layout, with every Triton launch turned
into a compile that launches nothing (``compile_only``). The judge then copies what that
process compiled into the store while it lives, as it does for a trusted process it
judged, and the candidate's own process later finds its kernels there. A warming process
serves candidate after candidate (all of them a seed's code), so that its device context
is made and torn down rarely; the judge waits for one starting where it waits for its
spares (``SandboxEvaluator._quiet``).

What it may assume and what it gives:

- Only trusted candidates are warmed: the process runs evokernel's code, a seed's and
  Triton's, so admitting its cache is no new trust. It is confined like every candidate
  process and sees the store read-only; nothing it says decides a verdict.
- Nothing runs on the device: meta tensors have no memory, and a launch only compiles
  (``JITFunction.run`` with ``warmup``). The process does hold a device context, as a
  spare does, which Triton needs to know its target.
- Its compiles use host cores while other candidates are clocked, as the CUDA prebuild's
  do; the judge waits only for a warming process starting (``_quiet``).
- It is an optimisation only. A seed whose host code cannot run on meta tensors (it reads
  a value back, say) warms nothing for that shape; a warm that fails, hangs or is not
  done in time costs compiles, never a verdict: the candidate compiles on demand as
  before, and every kernel, from the store or not, is checked like any other.
- Meta tensors' addresses are 0, so Triton specialises every pointer as 16-byte aligned,
  as it does the judge's slots (their offsets are aligned); integer arguments take the
  shape's real values.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from evokernel.evaluate.shared import DTYPES, TensorSpec

if TYPE_CHECKING:  # the candidate's process imports this module too: it needs neither
    from evokernel.candidate import Candidate
    from evokernel.evaluate.process import CandidateHandle

log = logging.getLogger(__name__)

__all__ = ["TritonWarmer", "compile_only", "meta_arguments"]


# -- inside the candidate's process -------------------------------------------------------


@contextlib.contextmanager
def compile_only() -> Iterator[list[str]]:
    """Within it, a Triton launch compiles its kernel (into the process's cache) and
    launches nothing; yields the names of the kernels asked for, in order. A seed whose
    host code asks its tensors' device something (its SM count, say) must read ``meta``
    as the current CUDA device itself (``triton_split.wave_size`` does).
    """
    from triton.runtime.jit import JITFunction

    asked: list[str] = []
    launch = JITFunction.run

    def compile_instead(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        asked.append(str(getattr(self, "__name__", self)))
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = compile_instead  # type: ignore[method-assign]
    try:
        yield asked
    finally:
        JITFunction.run = launch  # type: ignore[method-assign]


def meta_arguments(specs: Sequence[Sequence[Any]]) -> list[torch.Tensor]:
    """Meta tensors of one slot's arguments (``TensorSpec`` JSON: the judge's layout)."""
    out = []
    for data in specs:
        spec = TensorSpec.from_json(data)
        out.append(torch.empty(spec.shape, dtype=DTYPES[spec.dtype], device="meta"))
    return out


def warm_shapes(run: Callable[..., Any], shapes: Mapping[str, Sequence[Sequence[Any]]]) -> dict[str, Any]:
    """Call ``run`` once per shape on meta arguments under ``compile_only``: the reply of
    a candidate process's ``warm`` request (shapes warmed, kernels asked for, failures)."""
    warmed: list[str] = []
    failed: dict[str, str] = {}
    with compile_only() as asked:
        for shape, specs in shapes.items():
            try:
                run(*meta_arguments(specs))
            except Exception as exc:  # the seed's host code cannot run on meta tensors here
                failed[shape] = f"{type(exc).__name__}: {exc}"[:300]
            else:
                warmed.append(shape)
    return {"warmed": warmed, "kernels": len(asked), "failed": failed}


# -- in the judge's process ----------------------------------------------------------------


RECYCLE_AFTER = 64
"""Candidates a warming process loads before it is replaced (each leaves its module and
kernels in that process's memory)."""


@dataclass
class _Job:
    candidate: Candidate
    shapes: dict[str, list[list[Any]]]
    state: str = "queued"  # queued -> running -> done, or queued -> dropped
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Worker:
    """One warming thread's process, kept from one candidate to the next."""

    handle: CandidateHandle | None = None
    loads: int = 0


class TritonWarmer:
    """Warms trusted Triton candidates, ``workers`` at a time, each worker in one process
    of its own that it keeps for ``RECYCLE_AFTER`` candidates: every candidate it loads is
    a shipped seed's code, so one process may serve many, and a process starting or dying
    (a device context made or torn down) is rare, not one a candidate.

    Args:
        start: Starts a candidate process (``ProcessSupply.start``); called from the
            warmer's threads.
        started: Told how each start ended (``ProcessSupply.started``).
        load_fields: The ``load`` request's fields for a candidate (arguments, target).
        admit: Copies a live process's compiled kernels into the store
            (``SandboxEvaluator._admit_kernels``); entries the store holds already stay
            as they are.
        workers: Processes warming at once.
        timeout_s: Limit on each request to a warming process.

    Thread safety: every public method may be called from any thread.
    """

    def __init__(self, start: Callable[[str], CandidateHandle],
                 started: Callable[[CandidateHandle | None, Exception | None], None],
                 load_fields: Callable[[Candidate], dict[str, Any]],
                 admit: Callable[[CandidateHandle], None], *, workers: int, timeout_s: float) -> None:
        self._start, self._started = start, started
        self._load_fields, self._admit = load_fields, admit
        self.timeout_s = timeout_s
        self._jobs: dict[str, _Job] = {}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._workers = [_Worker() for _ in range(max(1, workers))]
        self._starting = 0
        self._closed = False
        self._counter = 0
        self.warmed = 0
        """Candidates whose warming process ran at least one shape through."""
        self._threads = [threading.Thread(target=self._serve, args=(w,), daemon=True)
                         for w in self._workers]
        for thread in self._threads:
            thread.start()

    def submit(self, candidates: Sequence[Candidate], shapes: dict[str, list[list[Any]]]) -> int:
        """Queue these candidates (any not queued before) for ``shapes``: per shape, one
        slot's argument specs. Returns how many were queued."""
        if not shapes:
            return 0
        queued = 0
        for cand in candidates:
            with self._lock:
                if self._closed or cand.id in self._jobs:
                    continue
                self._jobs[cand.id] = _Job(cand, dict(shapes))
            self._queue.put(cand.id)
            queued += 1
        return queued

    def wait(self, candidate_id: str, timeout_s: float) -> str:
        """Before a candidate loads: let its warm finish if one is running (its kernels
        then come from the store), drop it if it is still queued. Returns the job's state
        then (``done``, ``dropped``, ``running`` if the wait timed out) or ``none``."""
        with self._lock:
            job = self._jobs.get(candidate_id)
            if job is None:
                return "none"
            if job.state == "queued":
                job.state = "dropped"
                job.done.set()
                return "dropped"
        job.done.wait(timeout_s)
        return job.state

    def await_started(self, timeout_s: float = 120.0) -> float:
        """Wait until no warming process is starting (its device context being made), as
        the judge waits for its spares before a batch whose clock counts host work
        (``SandboxEvaluator._quiet``); returns the seconds waited."""
        began = time.perf_counter()
        with self._lock:
            self._changed.wait_for(lambda: self._starting == 0, timeout_s)
        return time.perf_counter() - began

    def idle(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or warming; False if that took too long."""
        deadline = time.monotonic() + timeout_s
        return all(job.done.wait(max(0.0, deadline - time.monotonic()))
                   for job in list(self._jobs.values()))

    def close(self) -> None:
        """Drop what is queued, kill the warming processes, stop the threads."""
        with self._lock:
            self._closed = True
            for job in self._jobs.values():
                if job.state == "queued":
                    job.state = "dropped"
                    job.done.set()
            handles = [w.handle for w in self._workers if w.handle is not None]
        for handle in handles:
            handle.kill()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=10.0)  # each ends once its process is killed

    def _serve(self, worker: _Worker) -> None:
        while True:
            candidate_id = self._queue.get()
            if candidate_id is None:
                self._retire(worker)
                return
            with self._lock:
                job = self._jobs[candidate_id]
                if job.state != "queued" or self._closed:
                    continue
                job.state = "running"
            try:
                if self._warm(worker, job):
                    with self._lock:
                        self.warmed += 1
            except Exception as exc:  # an optimisation: its failure costs compiles only
                log.warning("warming %s's Triton kernels failed: %s", job.candidate.id[:8], exc)
                with contextlib.suppress(Exception):
                    self._retire(worker)
            finally:
                with self._lock:
                    job.state = "done"
                job.done.set()

    def _process(self, worker: _Worker) -> CandidateHandle:
        """The worker's process, started (and ready) if it has none or used its last."""
        if worker.handle is not None and (worker.loads >= RECYCLE_AFTER or not worker.handle.alive()):
            self._retire(worker)
        if worker.handle is None:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the warmer is closed")
                self._counter += 1
                tag = f"warm-{self._counter:05d}"
                self._starting += 1
            try:
                handle = self._start(tag)
                with self._lock:  # a close() since the check above kills it here, not never
                    worker.handle, worker.loads = handle, 0
                    closed = self._closed
                if closed:
                    self._retire(worker)
                    raise RuntimeError("the warmer is closed")
                try:
                    handle.ready()
                except Exception as exc:
                    self._started(handle, exc)
                    raise
                self._started(handle, None)
            finally:
                with self._lock:
                    self._starting -= 1
                    self._changed.notify_all()
        return worker.handle

    def _retire(self, worker: _Worker) -> None:
        with self._lock:
            handle, worker.handle = worker.handle, None
        if handle is not None:
            handle.kill()

    def _warm(self, worker: _Worker, job: _Job) -> bool:
        handle = self._process(worker)
        if worker.loads:  # the last candidate's kernels are in the store: admit only the new
            handle.request("forget", self.timeout_s)
        worker.loads += 1
        reply = handle.request("load", self.timeout_s, **self._load_fields(job.candidate))
        if "error" in reply or reply.get("status"):
            log.info("warming %s: its build said %s", job.candidate.id[:8],
                     str(reply.get("message") or reply.get("error"))[:200])
            return False
        reply = handle.request("warm", self.timeout_s, shapes=job.shapes)
        if "error" in reply:
            log.info("warming %s failed: %s", job.candidate.id[:8], str(reply["error"])[:300])
            return False
        failed = reply.get("failed") or {}
        if failed:
            log.info("warming %s: %d shape(s) could not run on meta tensors, e.g. %s",
                     job.candidate.id[:8], len(failed), str(next(iter(failed.values())))[:200])
        self._admit(handle)
        return bool(reply.get("warmed"))
