"""Candidate processes as the judge sees them: start, talk, kill; spares started ahead.

A :class:`CandidateHandle` is one confined process (isolation.py) serving the judge
(candidate_process.py), reached only through its socket: forked by the fork server
(:class:`ForkServer`, zygote.py) or, where that is off or down, a fresh interpreter
running ``evokernel.evaluate.candidate_main``. A :class:`SparePool` keeps a few
started ahead, torch imported, the device ready and the shared chunks mapped, so a
candidate's evaluation does not wait for a process to start. A spare is fresh: no candidate code has ever run in it, and each
candidate gets its own process, which is killed (its whole namespace with it) when
its evaluation ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evokernel.evaluate.channel import (
    Channel,
    ChannelClosed,
    ChannelTimeout,
    ProtocolError,
    Session,
)
from evokernel.evaluate.isolation import Isolation, child_environment, command
from evokernel.evaluate.shared import Chunk

log = logging.getLogger(__name__)

LOG_TAIL = 64 * 1024
LOG_KEEP = 1 << 20
"""Bytes of a used process's log kept on disk once it is dead (its tail): a process may
write 256 MiB there (its file limit), and the logs of a long search would fill the disk
(red team 8's ``writes_huge_log.py``)."""
START_TIMEOUT_S = 180.0
UNKNOWN_EXIT = 255
"""The exit code of a forked process whose server could not say (it had stopped)."""
REPORT_WAIT_S = 2.0
"""Most a forked process's exit code may take to come after its exit (the server reaps
every 0.05 s)."""


MAP_FDS_PER_MESSAGE = 64
"""Chunks mapped per request (the kernel passes at most 253 descriptors in one message)."""


class CandidateFault(Exception):
    """The candidate's process replied with an error, died, hung or broke the protocol."""


class ForkServerDown(Exception):
    """The fork server could not start, or stopped answering: start fresh interpreters."""


SERVER_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1"}
"""Beside the allow-listed environment, for the fork server: numpy's OpenBLAS otherwise
starts a thread pool when torch is imported, and a process must have one thread to fork."""


class ForkServer:
    """The judge's end of a fork server (zygote.py): candidate processes forked from one
    that imported torch once. Its methods may be called from any thread."""

    def __init__(self, device: str, isolation: Isolation, log_path: Path,
                 timeout_s: float = START_TIMEOUT_S) -> None:
        self.device = device
        self.isolation = isolation
        log_path.parent.mkdir(parents=True, exist_ok=True)
        channel, theirs = Channel.pair()
        with log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "evokernel.evaluate.zygote", str(theirs.fileno()), device],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env=child_environment(isolation, SERVER_ENVIRONMENT),
                start_new_session=True, cwd="/",
            )
        theirs.close()
        self.channel = channel
        self._lock = threading.Lock()
        try:
            hello, _ = channel.receive(timeout_s)
        except (ChannelClosed, ChannelTimeout, ProtocolError) as exc:
            self.close()
            raise ForkServerDown(f"the fork server did not start: {exc}") from None
        if not hello.get("ready"):
            self.close()
            raise ForkServerDown(f"the fork server cannot fork: {hello.get('problem')}")
        self.import_s = float(hello.get("import_s") or 0.0)
        self.preloaded = bool(hello.get("preloaded"))
        """Whether the GPU libraries were imported in the server (else each fork imports them)."""

    def _ask(self, message: dict[str, Any], fds: tuple[int, ...] = (),
             timeout_s: float = 60.0) -> tuple[dict[str, Any], list[int]]:
        with self._lock:
            try:
                self.channel.send(message, fds)
                return self.channel.receive(timeout_s)
            except (ChannelClosed, ChannelTimeout, ProtocolError, OSError) as exc:
                raise ForkServerDown(f"the fork server stopped answering: {exc}") from None

    def spawn(self, channel_fd: int, log_fd: int, env: dict[str, str], threads: int) -> ForkedProcess:
        """A candidate's process forked with this channel and log (the caller keeps, and
        closes, its copies of both)."""
        report, theirs = os.pipe()  # its exit code comes back here, written by the server
        try:
            reply, fds = self._ask({"op": "spawn", "env": env, "device": self.device, "threads": threads,
                                    "namespaces": self.isolation.namespaces}, (channel_fd, log_fd, theirs))
        except BaseException:
            os.close(report)
            raise
        finally:
            os.close(theirs)
        if "error" in reply or len(fds) != 1 or not isinstance(reply.get("pid"), int):
            for fd in (*fds, report):
                os.close(fd)
            raise ForkServerDown(f"the fork server did not fork: {reply.get('error', reply)}")
        return ForkedProcess(int(reply["pid"]), fds[0], report)

    def close(self) -> None:
        """Stop the server (every process it forked dies with it)."""
        self.channel.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()


class ForkedProcess:
    """A process the fork server forked, used as ``subprocess.Popen`` is here: held by a
    pidfd (it is not the judge's child); the server reaps it and writes its exit code
    into the pipe ``report`` reads."""

    def __init__(self, pid: int, pidfd: int, report: int) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd
        self._report = report
        self.returncode: int | None = None

    def _exited(self, timeout_s: float | None) -> bool:
        if self._pidfd is None:
            return True
        return bool(select.select([self._pidfd], [], [], timeout_s)[0])

    def running(self) -> bool:
        """Not exited yet (then not reaped, so its pid is still its own)."""
        return not self._exited(0)

    def poll(self) -> int | None:
        if self._pidfd is None or not self._exited(0):
            return self.returncode if self._pidfd is None else None
        text = b""
        if select.select([self._report], [], [], REPORT_WAIT_S)[0]:  # the server reaps it soon
            with contextlib.suppress(OSError):
                text = os.read(self._report, 64)
        try:
            self.returncode = int(text.decode().strip())
        except ValueError:  # the server stopped before it reaped this one
            self.returncode = UNKNOWN_EXIT
        os.close(self._report)
        os.close(self._pidfd)
        self._pidfd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited(timeout):
            raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0.0)
        code = self.poll()
        assert code is not None
        return code

    def kill(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)


class CandidateHandle:
    """One started candidate process."""

    def __init__(self, device: str, isolation: Isolation, log_path: Path, threads: int = 1,
                 forks: ForkServer | None = None, env: dict[str, str] | None = None) -> None:
        """Start the process: forked by ``forks`` where given (raising ``ForkServerDown``
        if it cannot), else a fresh interpreter; ``env`` is added to its allow-listed
        environment."""
        self.device = device
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        channel, theirs = Channel.pair()
        extra = {**(env or {}), **({"OMP_NUM_THREADS": str(threads)} if device == "cpu" else {})}
        self.proc: subprocess.Popen[bytes] | ForkedProcess
        try:
            with log_path.open("wb") as out:
                if forks is not None:
                    self.proc = forks.spawn(theirs.fileno(), out.fileno(),
                                            child_environment(isolation, extra), threads)
                else:
                    self.proc = subprocess.Popen(
                        command(isolation, "evokernel.evaluate.candidate_main", str(theirs.fileno()), device),
                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT, env=child_environment(isolation, extra),
                        start_new_session=True, cwd="/",
                    )
        except BaseException:
            channel.close()
            raise
        finally:
            theirs.close()
        self.server = forks
        """The fork server this process was forked from (None: a fresh interpreter)."""
        self.session = Session(channel, secrets.token_hex(16))
        self.namespaced = isolation.namespaces
        self._first: int | None = None
        """A pidfd of the first process of its PID namespace, once known."""
        self._first_pid: int | None = None
        """That process's number in the judge's PID namespace."""
        self.trusted = False
        """Whether the candidate loaded into it is a shipped seed's code (set by the
        evaluator before it loads one; ``triton_store.TritonStore.trusts``)."""
        self.mapped: set[int] = set()
        self.bound: set[str] = set()
        """Shapes whose slots this process holds views of (bound before candidate code)."""
        self.rtt_s: float | None = None
        self.started = time.perf_counter()
        self.ready_in_s: float | None = None
        self.start_steps_s: dict[str, float] = {}
        """Seconds of each step of this process's start, as a spare (``spare_*``): its own
        account of its confinement, imports, device context, CUPTI and preloaded
        libraries, and the pool's of its first answer, mapping and binding."""
        """Seconds from its start until it was ready to serve (set by ``SparePool``)."""

    def request(self, op: str, timeout_s: float | None, fds: tuple[int, ...] = (),
                **fields: Any) -> dict[str, Any]:
        """Send one request and return the reply; a reply with ``error`` is returned too."""
        return self.session.request(op, timeout_s, fds, **fields)

    def send(self, op: str, **fields: Any) -> None:
        """``request`` in two: send now, and ``receive`` the reply later (the judge works
        in between, on what this process cannot reach)."""
        self.session.send(op, (), **fields)

    def receive(self, timeout_s: float | None) -> dict[str, Any]:
        return self.session.receive(timeout_s)

    def answered(self) -> bool:
        """Whether the reply to the request ``send`` sent has begun to arrive (no wait)."""
        return self.session.answered()

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for the process to answer, then measure its round trip (before any candidate)."""
        first = self.request("ping", timeout_s)
        steps = first.get("start_steps_s")  # its own account, before any candidate code
        if isinstance(steps, dict):
            self.start_steps_s.update({f"spare_{k}": float(v) for k, v in steps.items()
                                       if isinstance(k, str) and isinstance(v, int | float)
                                       and not isinstance(v, bool) and math.isfinite(v)})
        self._first = self._find_first()
        trips = []
        for _ in range(10):
            t0 = time.perf_counter()
            self.request("ping", 30.0)
            trips.append(time.perf_counter() - t0)
        self.rtt_s = min(trips)

    def map(self, chunks: dict[int, tuple[Chunk, bool]], timeout_s: float = 60.0) -> None:
        """Map the chunks this process has not mapped yet (and whether it may write them),
        and unmap those the judge has closed since: on a GPU a chunk's memory is freed
        only when every process that mapped it lets go."""
        missing = sorted(set(chunks) - self.mapped)
        stale = self.mapped - set(chunks)
        if not missing and not stale:
            return
        if stale:  # the process drops the shapes on chunks let go: bind again any left
            self.bound.clear()
        # a message carries at most 253 descriptors (SCM_MAX_FD): 128 shapes hold 256 chunks
        for start in range(0, max(1, len(missing)), MAP_FDS_PER_MESSAGE):
            part = missing[start : start + MAP_FDS_PER_MESSAGE]
            reply = self.request("map", timeout_s, tuple(chunks[i][0].fd for i in part),
                                 chunks=[[i, chunks[i][0].size, chunks[i][1]] for i in part],
                                 live=sorted(chunks))
            if "error" in reply:
                raise CandidateFault(f"mapping shared memory failed: {reply['error']}")
        self.mapped = (self.mapped - stale) | set(missing)

    def bind_ahead(self, slots: dict[str, list[list[Any]]], timeout_s: float = 60.0) -> None:
        """Make the views of these shapes' slots now, before any candidate code is loaded
        (a GPU process needs tens of ms a shape for it); the judge's ``bind`` of a shape
        bound here then only selects it."""
        for shape, specs in slots.items():
            chunks = {int(spec[0]) for slot in specs for spec in slot}  # TensorSpec.to_json
            if shape in self.bound or not chunks <= self.mapped:
                continue
            reply = self.request("bind", timeout_s, shape=shape, slots=specs, ahead=True)
            if "error" in reply:
                raise CandidateFault(f"binding the slots of {shape} failed: {reply['error']}")
            self.bound.add(shape)

    def calibrate(self, before: Callable[[], None], trips: int = 8) -> None:
        """Measure the round trip again as a timed batch sees it: right after the judge's
        own device work (``before``), with one tiny kernel of the process's own, so the
        switch between the two processes' contexts on the device is part of it, not of
        the candidate's time. Call it before any of
        the candidate's code is loaded: the figure is then the judge's to trust."""
        measured = []
        for _ in range(trips):
            before()
            t0 = time.perf_counter()
            self.request("ping", 30.0, touch=True)
            measured.append(time.perf_counter() - t0)
        self.rtt_s = min(measured)

    def least_span_s(self) -> float:
        """The CUPTI span of a one-element kernel of this process's own, in seconds (0 if
        CUPTI is unavailable). Ask it before any candidate code is loaded."""
        spans = self.request("cupti_floor", 60.0).get("spans_ms")
        found = [float(s) for s in spans or [] if isinstance(s, int | float) and s > 0]
        return min(found) / 1e3 if found else 0.0

    def _find_first(self) -> int | None:
        """The namespace's first process (``unshare``'s child), held by a pidfd from now on,
        so that killing can wait for it: once it is gone, so is every process in its
        namespace (the kernel kills and reaps them before it can finish exiting)."""
        pid = self.proc.pid
        if self.namespaced:
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                return None
            if not children:
                return None
            pid = int(children[0])
        try:
            first = os.pidfd_open(pid)
        except OSError:
            return None
        self._first_pid = pid
        return first

    def private_root(self) -> Path | None:
        """The root of the process's own mount namespace, as the judge sees it through
        ``/proc/<pid>/root`` while the process lives (a magic link: paths under it are
        the process's); None where it has no namespace or its first process is not known."""
        if not self.namespaced or self._first is None or self._first_pid is None:
            return None
        return Path(f"/proc/{self._first_pid}/root")

    def first_alive(self) -> bool:
        """Whether the namespace's first process still lives (its pidfd is not readable)."""
        if self._first is None:
            return False
        return not select.select([self._first], [], [], 0)[0]

    @property
    def forked(self) -> bool:
        return self.server is not None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, wait_s: float = 30.0) -> bool:
        """Kill the process and everything it started; return once they are all gone, or
        False if one outlived ``wait_s`` (a process stuck in the kernel: then it may still
        read and write every chunk it mapped; calling again waits again).

        With namespaces, waiting for the namespace's first process is waiting for all of
        them. Without, a descendant that left the process group can outlive this (the
        environment record says that the machine gave no namespaces).
        """
        gone = True
        if self._first is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                signal.pidfd_send_signal(self._first, signal.SIGKILL)
        # its process group by number: a Popen child is not reaped before ``wait``, but the
        # fork server reaps its forks at once, and a reaped fork's number may be anyone's
        # by now; a namespace's processes die with its first one anyway
        if not isinstance(self.proc, ForkedProcess) or (not self.namespaced and self.proc.running()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            gone = False
        if self._first is not None:
            exited, _, _ = select.select([self._first], [], [], wait_s)  # readable once exited
            if exited:
                os.close(self._first)
                self._first = None
            else:
                gone = False
        self.session.channel.close()
        return gone

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def trim_log(self, keep: int = LOG_KEEP) -> None:
        """Keep only the last ``keep`` bytes of the log; call once the process is dead.
        The tail replaces the file whole, so a reader sees the old file or the new."""
        try:
            size = self.log_path.stat().st_size
            if size <= keep:
                return
            with self.log_path.open("rb") as f:
                f.seek(size - keep)
                tail = f.read()
            part = self.log_path.with_name(self.log_path.name + ".part")
            part.write_bytes(f"[the first {size - keep} bytes of this log were cut]\n".encode() + tail)
            os.replace(part, self.log_path)
        except OSError as exc:
            log.warning("could not trim the log %s: %s", self.log_path, exc)

    def log_tail(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - LOG_TAIL))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


class SparePool:
    """Keeps ``size`` candidate processes started and ready ahead of their use."""

    def __init__(self, size: int, start: Callable[[str], CandidateHandle],
                 chunks: Callable[[], dict[int, tuple[Chunk, bool]]],
                 slots: Callable[[], dict[str, list[list[Any]]]] | None = None,
                 name: str = "spare",
                 started: Callable[[CandidateHandle | None, Exception | None], None] | None = None) -> None:
        self.size = max(1, size)
        self.name = name
        """Prefix of its processes' tags (and log files)."""
        self._start = start
        self._started = started
        """Told of every start, in the starting thread: (the process or None, None) once it
        is ready, (the process if there was one, the error) when it failed."""
        self._chunks = chunks
        self._slots = slots
        """The slot specs of every shape the judge holds, bound in a spare ahead of use."""
        self._lock = threading.Lock()
        self._ready: list[CandidateHandle] = []
        self._starting = 0
        self._counter = 0
        self._closed = False
        self._changed = threading.Condition(self._lock)

    def _launch(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._counter += 1
            tag = f"{self.name}-{self._counter:05d}"
            self._starting += 1
        handle: CandidateHandle | None = None
        launched = time.perf_counter()
        try:
            handle = self._start(tag)
            handle.ready()
            answered = time.perf_counter()
            handle.map(self._chunks())
            mapped = time.perf_counter()
            if self._slots is not None:
                handle.bind_ahead(self._slots())
            done = time.perf_counter()
            handle.ready_in_s = done - launched
            handle.start_steps_s.update({
                "spare_answer_s": answered - launched, "spare_map_s": mapped - answered,
                "spare_bind_s": done - mapped})
        except Exception as exc:
            log.warning("a spare candidate process failed to start: %s", exc)
            if handle is not None:
                log.warning("its output: %s", handle.log_tail()[-2000:])
                handle.kill()
            if self._started is not None:
                self._started(handle, exc)
            handle = None
        else:
            if self._started is not None:
                self._started(handle, None)
        with self._lock:
            self._starting -= 1
            if handle is not None and not self._closed:
                self._ready.append(handle)
            elif handle is not None:
                handle.kill()
            self._changed.notify_all()

    def fill(self, low_water: int | None = None) -> None:
        """Start processes in the background until ``size`` are ready or starting; with
        ``low_water``, only once no more than that many are (then all the missing ones at
        once, so that their starts overlap each other rather than many clocked batches)."""
        with self._lock:
            present = len(self._ready) + self._starting
            if low_water is not None and present > low_water:
                return
            wanted = self.size - present
        for _ in range(max(0, wanted)):
            try:
                threading.Thread(target=self._launch, daemon=True).start()
            except RuntimeError as exc:  # no task to be had now: ``take`` tries again
                log.warning("could not start a thread to start a spare process: %s", exc)
                return

    def take(self, timeout_s: float = START_TIMEOUT_S, refill: bool = True) -> CandidateHandle:
        """A ready process (waiting for one if none is); starts its replacement, unless
        ``refill`` is False: then the caller calls ``fill`` when a start disturbs nothing
        (``SandboxConfig.quiet_graphs``: once the candidate's clocked shapes are over).
        With none ready and none starting, one is started either way."""
        deadline = time.monotonic() + timeout_s
        if refill:
            self.fill()
        with self._lock:
            while not self._ready:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CandidateFault("no candidate process could be started in time")
                if self._starting == 0:
                    self._lock.release()
                    try:
                        self.fill()
                    finally:
                        self._lock.acquire()
                self._changed.wait(min(left, 1.0))
            handle = self._ready.pop(0)
        if refill:
            self.fill()
        if not handle.alive():
            handle.kill()
            return self.take(max(1.0, deadline - time.monotonic()), refill)
        return handle

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait until every spare is started (at most ``timeout_s``), then map and bind in
        each what the judge holds now (a spare started before some shape existed lacks
        it). Returns how many spares are ready. A run's set-up: no candidate is waiting."""
        deadline = time.monotonic() + timeout_s
        self.fill()
        with self._lock:
            while len(self._ready) < self.size and self._starting and time.monotonic() < deadline:
                self._changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            handles, self._ready = self._ready, []
        kept = self._rebind(handles)
        self.fill()
        return kept

    def await_started(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Wait until no process of this pool is starting (at most ``timeout_s``); returns
        the seconds waited. A start (an interpreter importing torch) takes a core for
        seconds: on a CPU judge, a candidate clocked beside it is timed slower than alone."""
        started = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._starting and time.monotonic() < deadline:
                self._changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
        return time.perf_counter() - started

    def refresh(self) -> None:
        """Map and bind in every ready spare what the judge holds now, without waiting for
        those still starting: after the judge closed chunks (a dropped or renewed bank), an
        idle spare would otherwise keep their memory (on a GPU, freed only when no process
        maps it)."""
        with self._lock:
            handles, self._ready = self._ready, []
        self._rebind(handles)
        self.fill()

    def _rebind(self, handles: list[CandidateHandle]) -> int:
        """Map and bind ahead in ``handles`` (taken out of the ready list), put back those
        that managed, kill the rest; returns how many were put back."""
        kept = []
        for handle in handles:
            try:
                handle.map(self._chunks())
                if self._slots is not None:
                    handle.bind_ahead(self._slots())
                kept.append(handle)
            except Exception as exc:
                log.warning("a spare candidate process failed while binding ahead: %s", exc)
                handle.kill()
        with self._lock:
            self._ready = kept + self._ready
            self._changed.notify_all()
        return len(kept)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        for handle in ready:
            handle.kill()
