"""Build ahead: compile the next CUDA candidates while the device times the current one.

An evaluation worker compiles its candidate before it can check or time it; with
the sources of the following candidates known (the runtime hands over a whole
batch), their compiles can run on idle CPU cores instead, and the worker then finds
its cubin in the shared :class:`~evokernel.evaluate.build_cache.BuildCache`.

Each compile is a separate short process (``python -m evokernel.evaluate.prebuild
JOB``) with the evaluation workers' clean environment and time limit: compiling
executes no candidate code, but a compiler can still hang or crash on hostile
input, and that must cost nothing. A build ahead is only ever an optimisation:
whatever it fails to do, the worker does itself and reports.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evokernel.candidate import Candidate, Language
from evokernel.evaluate.build import BuildError, check_cuda_nvcc, cuda_source, nvrtc_cubin
from evokernel.evaluate.build_cache import BuildCache


@dataclass
class _Entry:
    source: str
    state: str = "queued"  # queued -> running -> done, or queued -> dropped
    done: threading.Event = field(default_factory=threading.Event)


class Prebuilder:
    """Background compiles of queued CUDA candidates into ``cache_dir``.

    ``compiler`` is ``nvrtc`` on a GPU machine (the cubin the worker loads) or
    ``nvcc`` on a CPU one (the compile check a CPU evaluation does).
    """

    def __init__(
        self,
        cache_dir: Path,
        *,
        compiler: str,
        arch: str,
        workers: int,
        env: dict[str, str],
        timeout_s: float,
        prefix: Sequence[str] = (),
    ) -> None:
        if compiler not in ("nvrtc", "nvcc"):
            raise ValueError(f"unknown compiler {compiler!r}")
        self.cache_dir = Path(cache_dir)
        self.compiler, self.arch = compiler, arch
        self.env, self.timeout_s, self.prefix = env, timeout_s, tuple(prefix)
        self._entries: dict[str, _Entry] = {}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, candidates: Sequence[Candidate]) -> int:
        """Queue the CUDA candidates not seen before; returns how many were queued."""
        queued = 0
        for cand in candidates:
            if cand.language is not Language.CUDA:
                continue
            try:
                source = cuda_source(cand)
            except BuildError:
                continue  # nothing to compile; the worker reports why
            with self._lock:
                if self._closed or cand.id in self._entries:
                    continue
                self._entries[cand.id] = _Entry(source)
            self._queue.put(cand.id)
            queued += 1
        return queued

    def wait(self, candidate_id: str, timeout_s: float) -> str:
        """Before evaluating: let a running compile finish, drop a queued one.

        Returns the entry's final state (``done``, ``dropped``, ``running`` if the
        wait timed out) or ``none`` for a candidate never submitted.
        """
        with self._lock:
            entry = self._entries.get(candidate_id)
            if entry is None:
                return "none"
            if entry.state == "queued":
                entry.state = "dropped"  # the worker will compile it itself, now
                entry.done.set()
                return "dropped"
        entry.done.wait(timeout_s)
        return entry.state

    def idle(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or compiling; False if that took too long."""
        deadline = time.monotonic() + timeout_s
        for entry in list(self._entries.values()):
            if not entry.done.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def _serve(self) -> None:
        while True:
            cid = self._queue.get()
            if cid is None:
                return
            with self._lock:
                entry = self._entries[cid]
                if entry.state != "queued" or self._closed:
                    continue
                entry.state = "running"
            try:
                self._compile(entry.source)
            finally:
                with self._lock:
                    entry.state = "done"
                entry.done.set()

    def _compile(self, source: str) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"source": source, "arch": self.arch, "compiler": self.compiler,
                       "cache": str(self.cache_dir)}, f)
            job = Path(f.name)
        try:
            proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "benchmarks.legacy_evaluator.prebuild", str(job)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
            )
            with self._lock:
                self._procs.add(proc)
            try:
                proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            finally:
                with self._lock:
                    self._procs.discard(proc)
        finally:
            job.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            procs = list(self._procs)
            for entry in self._entries.values():
                entry.done.set()
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for _ in self._threads:
            self._queue.put(None)


def compile_job(job: dict[str, str]) -> None:
    """What one build-ahead process does: compile ``job['source']`` into the cache."""
    cache = BuildCache(Path(job["cache"]))
    if job["compiler"] == "nvrtc":
        nvrtc_cubin(job["source"], job["arch"], cache)
    else:
        check_cuda_nvcc(job["source"], job["arch"], cache)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        compile_job(json.loads(Path(args[0]).read_text()))
    except BuildError:
        return 1  # the evaluation worker meets the same error and reports it
    return 0


if __name__ == "__main__":
    sys.exit(main())
