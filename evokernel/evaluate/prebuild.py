"""CUDA compiles in confined processes, ahead of evaluation or on demand.

Compiling runs no candidate code, but a compiler fed hostile source can hang, crash,
or read files through ``#include``; so every compile runs in a short process confined
like a candidate's (isolation.py), reading its job from stdin and answering on
stdout: ``python -m evokernel.evaluate.prebuild``. Only the judge's process writes
the :class:`~evokernel.evaluate.build_cache.BuildCache`, from those answers: no
process that handles candidate code can write a binary another candidate will load.

Two uses: :meth:`Prebuilder.submit` compiles a batch's CUDA candidates on idle CPU
cores while the device times the current one (an optimisation: whatever it fails to
do is done on demand), and :meth:`Prebuilder.build` compiles one now, or returns it
from the cache.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evokernel.candidate import Candidate, Language
from evokernel.evaluate.build import (
    NVRTC_OPTIONS,
    BuildError,
    compile_cuda_nvrtc,
    cuda_source,
    nvcc_version,
    nvrtc_version,
    parse_resource_usage,
)
from evokernel.evaluate.build_cache import BuildCache, build_key
from evokernel.evaluate.isolation import Isolation, child_environment, command

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Built:
    """A compile's outcome: the binary and what the compiler said, or why it failed."""

    binary: bytes | None
    meta: dict[str, Any]
    error: str = ""
    cached: bool = False
    unavailable: bool = False
    """The compiler is missing on this machine: nothing was said about the source."""


@dataclass
class _Entry:
    source: str
    state: str = "queued"  # queued -> running -> done, or queued -> dropped
    done: threading.Event = field(default_factory=threading.Event)


class Prebuilder:
    """Compiles CUDA sources for ``arch`` with ``compiler`` (nvrtc or nvcc) into ``cache_dir``."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        compiler: str,
        arch: str,
        workers: int,
        isolation: Isolation,
        timeout_s: float,
    ) -> None:
        if compiler not in ("nvrtc", "nvcc"):
            raise ValueError(f"unknown compiler {compiler!r}")
        self.cache = BuildCache(Path(cache_dir))
        self.compiler, self.arch = compiler, arch
        self.isolation, self.timeout_s = isolation, timeout_s
        self._entries: dict[str, _Entry] = {}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def key(self, source: str) -> str:
        if self.compiler == "nvrtc":
            return build_key("nvrtc", nvrtc_version(), self.arch, *NVRTC_OPTIONS, source)
        return build_key("nvcc", nvcc_version(shutil.which("nvcc") or "nvcc"), self.arch, source)

    # -- on demand ----------------------------------------------------------------------

    def build(self, candidate: Candidate) -> Built:
        """The candidate's binary: a compile ahead that is under way is awaited first."""
        try:
            source = cuda_source(candidate)
        except BuildError as exc:
            return Built(None, {}, str(exc))
        if self.compiler == "nvcc" and shutil.which("nvcc") is None:
            return Built(None, {}, "nvcc is not on PATH", unavailable=True)
        self.wait(candidate.id, self.timeout_s)
        key = self.key(source)
        hit = self.cache.load(key)
        if hit is not None:
            return Built(hit[0], hit[1], cached=True)
        return self._compile(source, key)

    # -- ahead ----------------------------------------------------------------------------

    def submit(self, candidates: Sequence[Candidate]) -> int:
        """Queue the CUDA candidates not seen before; returns how many were queued."""
        queued = 0
        for cand in candidates:
            if cand.language is not Language.CUDA:
                continue
            try:
                source = cuda_source(cand)
            except BuildError:
                continue  # nothing to compile; the evaluation reports why
            with self._lock:
                if self._closed or cand.id in self._entries:
                    continue
                self._entries[cand.id] = _Entry(source)
            self._queue.put(cand.id)
            queued += 1
        return queued

    def wait(self, candidate_id: str, timeout_s: float) -> str:
        """Let a running compile finish, drop a queued one.

        Returns the entry's final state (``done``, ``dropped``, ``running`` if the wait
        timed out) or ``none`` for a candidate never submitted.
        """
        with self._lock:
            entry = self._entries.get(candidate_id)
            if entry is None:
                return "none"
            if entry.state == "queued":
                entry.state = "dropped"  # it is compiled on demand, now
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
                key = self.key(entry.source)
                if self.cache.load(key) is None:
                    self._compile(entry.source, key)
            finally:
                with self._lock:
                    entry.state = "done"
                entry.done.set()

    def _compile(self, source: str, key: str) -> Built:
        """Compile in a confined process; store a success in the cache (this process only)."""
        job = json.dumps({"source": source, "arch": self.arch, "compiler": self.compiler})
        argv = command(self.isolation, "evokernel.evaluate.prebuild")
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=child_environment(self.isolation), start_new_session=True, cwd="/",
            )
        except OSError as exc:
            return Built(None, {}, f"the compiler process did not start: {exc}")
        with self._lock:
            self._procs.add(proc)
        try:
            out, _ = proc.communicate(job.encode(), timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return Built(None, {}, f"the compile took longer than {self.timeout_s:.0f} s")
        finally:
            with self._lock:
                self._procs.discard(proc)
        try:
            answer = json.loads(out.decode() or "{}")
            if answer.get("ok"):
                binary = base64.b64decode(answer["binary"])
                meta = dict(answer.get("meta", {}))
            else:
                return Built(None, {}, str(answer.get("log") or
                                           f"the compiler process failed (exit code {proc.returncode})"))
        except (ValueError, KeyError, TypeError) as exc:
            return Built(None, {}, f"unreadable answer from the compiler process: {exc}")
        self.cache.store(key, binary, meta)
        return Built(binary, meta)

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


# -- the compile process -------------------------------------------------------------------


def compile_job(job: dict[str, str]) -> dict[str, Any]:
    """What one compile process does; the answer it prints on stdout."""
    started = time.perf_counter()
    if job["compiler"] == "nvrtc":
        binary = compile_cuda_nvrtc(job["source"], job["arch"])
        meta: dict[str, Any] = {"compiler": "nvrtc", "arch": job["arch"]}
    else:
        binary, log_text = _nvcc(job["source"], job["arch"])
        meta = {"compiler": "nvcc", "arch": job["arch"], "resources": parse_resource_usage(log_text)}
    meta["build_s"] = time.perf_counter() - started
    return {"ok": True, "binary": base64.b64encode(binary).decode(), "meta": meta}


def _nvcc(source: str, arch: str) -> tuple[bytes, str]:
    import tempfile

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("nvcc is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cubin = Path(tmp) / "kernel.cubin"
        proc = subprocess.run(
            [nvcc, f"-arch={arch}", "-std=c++17", "-cubin", "--resource-usage", "-o", str(cubin),
             str(src)], capture_output=True, text=True, timeout=600,
        )
        text = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise BuildError(text)
        return cubin.read_bytes(), text


def main() -> int:
    from evokernel.evaluate.isolation import confine

    confine()
    job = json.loads(sys.stdin.read())
    try:
        answer = compile_job(job)
    except BuildError as exc:
        answer = {"ok": False, "log": str(exc)}
    except Exception as exc:
        answer = {"ok": False, "log": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
