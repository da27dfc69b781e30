"""How the judge's candidate processes start: forked by the fork server, else fresh.

A candidate's process is forked by the fork server (zygote.py), which imported torch once,
where that server runs; a fresh interpreter takes seconds to import torch, and on a busy
GPU host kept its cores busy. Where the server cannot start, stops answering, or its forks
keep dying before they are ready (a device that cannot be used in a fork, say), processes
start as fresh interpreters for the rest of the run, confined the same way, and the
environment record says so and why (``describe``).

The spare pools (process.py's ``SparePool``) call ``start`` from their starting threads and
tell ``started`` how each start ended; which lane a process serves, what it maps and when
it dies are the evaluator's business, not this module's.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch

from evokernel.evaluate.isolation import Isolation
from evokernel.evaluate.process import CandidateHandle, ForkServer, ForkServerDown

log = logging.getLogger(__name__)

__all__ = ["FORKS_FAILED_LIMIT", "ProcessSupply"]

FORKS_FAILED_LIMIT = 3
"""Forked processes in a row that may fail to become ready before fresh interpreters
start instead (each failure is logged with the process's output)."""


class ProcessSupply:
    """Starts candidate processes for the spare pools, by fork server or fresh interpreter.

    The fork server starts at the first ``start``; once it is turned off (it failed to
    start or to fork, or its forks kept failing), every later start is a fresh interpreter.
    A server turned off is closed only by ``close``: the processes it forked die with it,
    and one of them may be a candidate being judged.

    Thread safety: every method may be called from any thread. One lock guards the server,
    the servers turned off, the count of failed forks and the start's description; it is
    held while the server starts (seconds), so starts wait for it rather than start a
    second one.

    Args:
        device: The candidates' device (``SandboxConfig.device``, resolved: ``cuda``,
            ``cpu``), given to every process and to the server.
        isolation: How every process is confined.
        log_dir: Where each process's output goes (``<tag>.log``) and the server's
            (``fork-server.log``).
        cpu_threads: Threads a process on the CPU may use.
        fork_server: ``SandboxConfig.fork_server``: False starts fresh interpreters only.
        env: Added to every process's allow-listed environment (the Triton store's).
    """

    def __init__(self, device: str, isolation: Isolation, log_dir: Path, cpu_threads: int,
                 fork_server: bool = True, env: dict[str, str] | None = None) -> None:
        self._env = dict(env or {})
        self._device = device
        self._isolation = isolation
        self._log_dir = log_dir
        self._cpu_threads = cpu_threads
        self._enabled = fork_server
        self._forks_lock = threading.Lock()
        self._forks: ForkServer | None = None
        self._retired_forks: list[ForkServer] = []
        """Fork servers no longer asked to fork, closed with the evaluator."""
        self._forks_failed = 0
        """Forked processes in a row that failed to become ready (``started``)."""
        self._spawn = "" if fork_server else "fresh interpreters (fork_server off)"
        """How candidate processes start: ``fork server``, or ``fresh interpreters`` and why."""

    def start(self, tag: str) -> CandidateHandle:
        """A started candidate's process, its output logged as ``<tag>.log``: forked by the
        fork server where it runs, else a fresh interpreter (a fork the server fails turns
        it off, and this start falls back at once).

        Called from the spare pools' threads. The process is started and nothing more:
        the caller waits for it to be ready, maps its chunks, and tells ``started``.
        """
        log_path = self._log_dir / f"{tag}.log"
        forks = self._fork_server()
        if forks is not None:
            try:
                return CandidateHandle(self._device, self._isolation, log_path,
                                       self._cpu_threads, forks=forks, env=self._env)
            except ForkServerDown as exc:
                self._fork_server_down(forks, str(exc))
        return CandidateHandle(self._device, self._isolation, log_path, self._cpu_threads,
                               env=self._env)

    def started(self, handle: CandidateHandle | None, error: Exception | None) -> None:
        """A start ended (``SparePool``'s ``started``, in the pool's thread): ``handle`` is
        the process, or None where none was made; ``error`` why it failed, or None once it
        is ready. ``FORKS_FAILED_LIMIT`` forks in a row that fail to become ready (a device
        that cannot be used in them, say) turn the fork server off; a fresh interpreter's
        start counts for nothing here."""
        if handle is None or not handle.forked:
            return
        with self._forks_lock:
            self._forks_failed = 0 if error is None else self._forks_failed + 1
            failed, forks = self._forks_failed, self._forks
        if failed >= FORKS_FAILED_LIMIT and forks is not None:
            self._fork_server_down(forks, f"{failed} forked processes in a row failed to start: {error}")

    def server_stopped(self, handle: CandidateHandle) -> bool:
        """Whether the fork server ``handle`` was forked from has stopped, taking its forks
        with it, so that what its process failed since is not its candidate's doing: the
        evaluation may be run again. A stopped server is turned off here (fresh interpreters
        from now on). False where the candidate could have stopped the server itself
        (neither another user nor in its own PID namespace): its failure then stands.
        Called by the evaluator after a failed evaluation."""
        server = handle.server
        if server is None or server.proc.poll() is None:
            return False
        self._fork_server_down(server, "the fork server stopped")
        return self._isolation.namespaces or self._isolation.unprivileged

    def describe(self) -> str:
        """How processes start now, for the environment record: ``fork server`` (with a
        note where the GPU libraries are imported in each fork), ``fresh interpreters (why)``,
        or ``fork server (not started yet)``. It can change during a run: read it each time."""
        return self._spawn or "fork server (not started yet)"

    def close(self) -> None:
        """Close the fork server and every one turned off (the processes they forked die
        with them). Called with the evaluator, once no candidate is judged."""
        with self._forks_lock:
            servers, self._retired_forks = [*self._retired_forks, self._forks], []
            self._forks = None
        for server in servers:
            if server is not None:
                server.close()

    def _fork_server(self) -> ForkServer | None:
        """The fork server, started at the first call (None where it is off or failed)."""
        with self._forks_lock:
            if self._forks is None and self._enabled and self._spawn == "":
                try:
                    self._forks = ForkServer(self._device, self._isolation,
                                             self._log_dir / "fork-server.log")
                    cpu = torch.device(self._device).type == "cpu"
                    self._spawn = "fork server" if self._forks.preloaded or cpu \
                        else "fork server (cuPy and Triton imported in each fork: not before a fork)"
                except ForkServerDown as exc:
                    self._fresh_from_now(str(exc))
            return self._forks

    def _fork_server_down(self, forks: ForkServer, why: str) -> None:
        """The fork server failed a start: from now on fresh interpreters. It is closed
        only with the evaluator: the processes it forked die with it, and one of them may
        be a candidate being judged."""
        with self._forks_lock:
            if forks is self._forks:
                self._forks = None
                self._retired_forks.append(forks)
            self._fresh_from_now(why)

    def _fresh_from_now(self, why: str) -> None:
        """Say once (and in the environment record) why processes start fresh; under
        ``_forks_lock``."""
        if not self._spawn.startswith("fresh"):
            log.warning("candidate processes start as fresh interpreters: %s", why)
            self._spawn = f"fresh interpreters ({why})"
