"""A trusted candidate's Triton kernels compiled ahead of its evaluation, into the store.

A Triton candidate compiles its kernels on its first calls, in its own process, while the
judge waits: 2-6 s a point of a dsa_sparse_attention landscape for ``triton_split``, 10-40 s
for fused_moe's ``triton_fused`` (H100, 2026-12-08, ``phase_checked_calls_ms``). The store
(triton_store.py) spares a variant the kernels an earlier process of the same seed built,
not the ones its own knobs change. This module builds those ahead, on idle CPU cores, while
the device times the candidate before: for each candidate the runtime hands to ``prepare``
that the store ``trusts`` (a shipped seed's exact code) and that is written in Triton, a
candidate process of its own loads it and calls it once per shape on *meta* tensors of the
shape's argument layout, with every Triton launch turned into a compile that launches
nothing (``compile_only``). The judge then copies what that process compiled into the
store before killing it, exactly as it does for a trusted process it judged, and the
candidate's own process later finds its kernels there.

What it may assume and what it gives:

- Only trusted candidates are warmed: the process runs evokernel's code, a seed's and
  Triton's, so admitting its cache is no new trust. It is confined like every candidate
  process and sees the store read-only; nothing it says decides a verdict.
- Nothing runs on the device: meta tensors have no memory, and a launch only compiles
  (``JITFunction.run`` with ``warmup``). The process does hold a device context, as a
  spare does, which Triton needs to know its target.
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
    launches nothing; yields the names of the kernels asked for, in order.

    A seed's host code asks its device for its SM count (``torch.cuda.get_device_properties``)
    with its tensors' device, here ``meta``: that question goes to the current device.
    """
    from triton.runtime.jit import JITFunction

    asked: list[str] = []
    launch = JITFunction.run
    properties = torch.cuda.get_device_properties

    def compile_instead(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        asked.append(str(getattr(self, "__name__", self)))
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    def device_properties(device: Any = None) -> Any:
        if (isinstance(device, torch.device) and device.type == "meta") or device == "meta":
            device = None
        return properties(device)

    JITFunction.run = compile_instead  # type: ignore[method-assign]
    torch.cuda.get_device_properties = device_properties
    try:
        yield asked
    finally:
        JITFunction.run = launch  # type: ignore[method-assign]
        torch.cuda.get_device_properties = properties


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


@dataclass
class _Job:
    candidate: Candidate
    shapes: dict[str, list[list[Any]]]
    state: str = "queued"  # queued -> running -> done, or queued -> dropped
    done: threading.Event = field(default_factory=threading.Event)


class TritonWarmer:
    """Warms trusted Triton candidates in processes of their own, ``workers`` at a time.

    Args:
        start: Starts a candidate process (``ProcessSupply.start``); called from the
            warmer's threads.
        started: Told how each start ended (``ProcessSupply.started``).
        load_fields: The ``load`` request's fields for a candidate (arguments, target).
        admit: Copies a live process's compiled kernels into the store
            (``SandboxEvaluator._admit_kernels``).
        workers: Processes warming at once.
        timeout_s: Limit on each request to a warming process.

    Thread safety: ``submit``, ``wait``, ``idle`` and ``close`` may be called from any
    thread.
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
        self._live: set[CandidateHandle] = set()
        self._closed = False
        self._counter = 0
        self.warmed = 0
        """Candidates whose process warmed at least one shape."""
        self.seconds = 0.0
        """Seconds the warming processes took, summed (start to kill)."""
        self._threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(max(1, workers))]
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

    def idle(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or warming; False if that took too long."""
        deadline = time.monotonic() + timeout_s
        return all(job.done.wait(max(0.0, deadline - time.monotonic()))
                   for job in list(self._jobs.values()))

    def close(self) -> None:
        """Drop what is queued, kill what is warming, stop the threads."""
        with self._lock:
            self._closed = True
            live = list(self._live)
            for job in self._jobs.values():
                if job.state == "queued":
                    job.state = "dropped"
                    job.done.set()
        for handle in live:
            handle.kill()
        for _ in self._threads:
            self._queue.put(None)

    def _serve(self) -> None:
        while True:
            candidate_id = self._queue.get()
            if candidate_id is None:
                return
            with self._lock:
                job = self._jobs[candidate_id]
                if job.state != "queued" or self._closed:
                    continue
                job.state = "running"
                self._counter += 1
                tag = f"warm-{self._counter:05d}"
            began = time.perf_counter()
            try:
                if self._warm(job, tag):
                    with self._lock:
                        self.warmed += 1
            except Exception as exc:  # an optimisation: its failure costs compiles only
                log.warning("warming %s's Triton kernels failed: %s", job.candidate.id[:8], exc)
            finally:
                with self._lock:
                    self.seconds += time.perf_counter() - began
                    job.state = "done"
                job.done.set()

    def _warm(self, job: _Job, tag: str) -> bool:
        handle: CandidateHandle | None = None
        try:
            handle = self._start(tag)
            with self._lock:
                self._live.add(handle)
                closed = self._closed
            if closed:
                return False
            try:
                handle.ready()
            except Exception as exc:
                self._started(handle, exc)
                raise
            self._started(handle, None)
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
        finally:
            if handle is not None:
                handle.kill()
                with self._lock:
                    self._live.discard(handle)
