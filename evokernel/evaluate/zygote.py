"""The fork server: candidate processes forked from one that imported torch once.

A candidate's process started as a fresh interpreter spends seconds of a core before it
can serve: on a 16-core H100 host judging 75 candidates a minute, importing torch took
5.2 s of a spare's 8.1 s start and the host's cores were 92% busy, most of it spares
starting (``throughput-dsa_topk-spare_steps-h100-2026-12-06.json``), so the judge and
the candidate being clocked shared the host with a dozen interpreters loading libraries.
The fork server, ``python -m evokernel.evaluate.zygote FD DEVICE``, imports torch (and on
a GPU cuPy and Triton) once, without ever touching the device, then forks a process for
each candidate the judge asks for. The fork becomes exactly what a fresh
``candidate_main`` would have been:

1. it keeps only its channel (descriptor 3) and its log (1 and 2), closes every other
   descriptor it inherited (the server's control socket first), and starts a session;
2. with namespaces, it makes new PID, mount, network and IPC namespaces, makes every
   mount private, and forks again, as ``unshare --fork --kill-child`` does: the parent
   stays outside as the namespace's keeper (it waits, and dies with the server), the
   child is the namespace's first process and mounts a ``/proc`` of its own;
3. it takes the environment the judge computed for it (the allow-list of
   ``isolation.child_environment``), confines itself (``isolation.confine``: the same
   layers, before anything of a candidate exists in it) and serves the judge
   (``candidate_process.run_process``).

The server holds nothing of the judge's or of any candidate's: it is started with the
allow-listed environment, receives only the descriptors it hands on (closing its copies
at once) and never runs candidate code. A forked device context is unusable, so before
every fork it checks that it has one thread and no device file open; where that fails
(or the server cannot start) the judge starts fresh interpreters instead and says so in
the environment record.

Its protocol, on the control socket (a :class:`~evokernel.evaluate.channel.Channel`):

``hello``  sent once ready: ``{"ready": bool, "problem": str, "preloaded": bool,
           "import_s": float}`` (``preloaded``: cuPy and Triton imported here; false on
           the CPU, or where they made it unable to fork, so that it started again
           without them and each fork imports them)
``spawn``  ``{"op": "spawn", "env": {...}, "device": str, "threads": int,
           "namespaces": bool}`` with the descriptors [channel, log, report]; the reply
           is ``{"pid": int}`` with a pidfd of the forked process (or ``{"error": str}``).
           ``report`` is the write end of a pipe: once the fork has exited, the server
           writes its exit code there (ASCII, one line) and closes it. The server keeps
           no exit code in its memory (every later fork would inherit the codes earlier
           candidates chose, a channel between them: red team of 2026-12-06).

It exits when the judge closes the control socket; every process it forked dies with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from evokernel.evaluate.channel import Channel, ChannelClosed, ProtocolError

CHANNEL_FD = 3
"""Where a forked candidate process finds its channel to the judge."""
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC
"""What ``isolation.UNSHARE_FLAGS`` asks of ``unshare``: PID, mount, network, IPC."""
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1
REAP_EVERY_S = 0.05
"""How often the server reaps its exited forks (and reports their exit codes)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:  # it ended meanwhile
            continue
    return names


def fork_unsafe(wait_s: float = 0.0) -> str | None:
    """Why this process must not fork a candidate's process now, or None: another thread
    (only the forking one survives a fork, with whatever locks the others held) or an open
    device file (a CUDA context cannot be used across a fork). A thread that ends within
    ``wait_s`` (one a library started for a moment) is waited for."""
    deadline = time.monotonic() + wait_s
    while len(threads := _thread_names()) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    if len(threads) != 1:
        return f"the fork server runs {len(threads)} threads ({', '.join(threads)})"
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/dev/nvidia"):
                return f"the fork server holds a device file ({target})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the fork server made a CUDA context"
    return None


# -- the forked process ----------------------------------------------------------------------


def _own_descriptors(channel_fd: int, log_fd: int) -> None:
    """Standard input from /dev/null, output and errors to the log, the channel on
    ``CHANNEL_FD``; every other inherited descriptor closed."""
    channel = fcntl.fcntl(channel_fd, fcntl.F_DUPFD, 10)
    log_out = fcntl.fcntl(log_fd, fcntl.F_DUPFD, 10)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_out, 1)
    os.dup2(log_out, 2)
    os.dup2(channel, CHANNEL_FD)
    os.closerange(CHANNEL_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _die_with_parent(parent: int) -> None:
    """SIGKILL when ``parent`` (a pidfd of it) exits; exits now if it already has."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([parent], [], [], 0)[0]:  # it died before the request took hold
        os._exit(1)
    os.close(parent)


def _keep(first: int) -> NoReturn:
    """The namespace's keeper: wait for its first process and end as it ended (its
    signal raised on itself), so that the exit code the server reports is the candidate's."""
    while True:
        try:
            _, status = os.waitpid(first, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _enter_namespaces() -> None:
    """New PID, mount, network and IPC namespaces, every mount private; returns in the
    namespace's first process with its own /proc (the caller's process stays outside as
    its keeper and never returns)."""
    libc = _libc()
    if libc.unshare(NAMESPACES) != 0:
        raise OSError(ctypes.get_errno(), "unshare of the PID, mount, network and IPC namespaces failed")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:  # nothing leaks to the host
        raise OSError(ctypes.get_errno(), "making the mounts private failed")
    keeper = os.pidfd_open(os.getpid())
    first = os.fork()
    if first:
        os.close(keeper)
        # it keeps its copy of the channel, as unshare does: the judge sees the channel
        # close only once the keeper has ended too, its exit code (the candidate's) known
        _keep(first)
    _die_with_parent(keeper)
    if libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        raise OSError(ctypes.get_errno(), "mounting the namespace's /proc failed")


def _become_candidate(request: dict[str, Any], channel_fd: int, log_fd: int, server: int,
                      asked_at: float) -> NoReturn:
    """In the fork: become a confined candidate's process serving the judge. Never returns."""
    try:
        _die_with_parent(server)
        _own_descriptors(channel_fd, log_fd)
        os.setsid()
        forked = time.perf_counter()
        if request.get("namespaces"):
            _enter_namespaces()
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request.get("env") or {}).items()})
        device = str(request.get("device") or "cpu")
        # the arguments a fresh candidate_main gets: its channel's descriptor, its device
        sys.argv = [str(Path(__file__).with_name("candidate_main.py")), str(CHANNEL_FD), device]
        from evokernel.evaluate.isolation import confine

        begun = time.perf_counter()
        scratch = confine()
        steps = {"fork_s": forked - asked_at, "namespaces_s": begun - forked,
                 "confine_s": time.perf_counter() - begun}
        if device == "cpu":
            import torch

            torch.set_num_threads(max(1, int(request.get("threads") or 1)))
        from evokernel.evaluate.candidate_process import run_process

        run_process(CHANNEL_FD, device, scratch, steps)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
    os._exit(1)


# -- the server ------------------------------------------------------------------------------


class _Server:
    def __init__(self, control: Channel) -> None:
        self.control = control
        self.reports: dict[int, int] = {}
        """Per live fork, the descriptor its exit code goes to (no code is ever kept)."""
        self.me = os.getpid()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            report = self.reports.pop(pid, None)
            if report is not None:
                with contextlib.suppress(OSError):
                    os.write(report, f"{os.waitstatus_to_exitcode(status)}\n".encode())
                os.close(report)

    def spawn(self, request: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        asked_at = time.perf_counter()
        kept: int | None = None
        try:
            if len(fds) != 3:
                return {"error": f"spawn needs a channel, a log and a report, got {len(fds)} descriptors"}, []
            problem = fork_unsafe(wait_s=1.0)
            if problem is not None:
                print(f"fork server: {problem}", file=sys.stderr, flush=True)
                return {"error": problem}, []
            server = os.pidfd_open(self.me)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self.control.sock.detach()  # its descriptor is closed with the rest, never reused
                self.reports.clear()  # the other forks' (their descriptors are closed too)
                _become_candidate(request, fds[0], fds[1], server, asked_at)
            os.close(server)
            kept = self.reports[pid] = fds[2]
            return {"pid": pid}, [os.pidfd_open(pid)]
        finally:
            for fd in fds:
                if fd != kept:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def serve(self) -> int:
        while True:
            self.reap()
            if not select.select([self.control.sock], [], [], REAP_EVERY_S)[0]:
                continue
            try:
                request, fds = self.control.receive()
            except ChannelClosed:
                return 0
            except ProtocolError as exc:
                print(f"fork server: {exc}", file=sys.stderr)
                return 1
            op = request.get("op")
            out: list[int] = []
            if op == "spawn":
                reply, out = self.spawn(request, fds)
            else:
                for fd in fds:
                    os.close(fd)
                reply = {"error": f"unknown request {op!r}"}
            try:
                self.control.send(reply, out)
            except ChannelClosed:
                return 0
            finally:
                for fd in out:
                    os.close(fd)


BARE = "--bare"
"""Argument for a server that imports torch alone (its first try with the GPU libraries
left it unable to fork): each fork then imports those itself, as a spare."""


def main() -> int:
    fd = int(sys.argv[1])
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    bare = BARE in sys.argv[3:]
    begun = time.perf_counter()
    # torch, the builders and the clock, imported once here
    from evokernel.evaluate.candidate_process import preload_libraries

    if fork_unsafe(wait_s=2.0) is None and device != "cpu" and not bare:
        preload_libraries()
        if fork_unsafe(wait_s=2.0) is not None:  # a library touched the device or left a thread
            os.execv(sys.executable, [sys.executable, "-m", "evokernel.evaluate.zygote",
                                      str(fd), device, BARE])
    control = Channel(socket.socket(fileno=fd))
    problem = fork_unsafe(wait_s=2.0)
    if problem is not None:
        print(f"fork server: {problem}", file=sys.stderr, flush=True)
    control.send({"ready": problem is None, "problem": problem or "", "preloaded": device != "cpu" and not bare,
                  "import_s": time.perf_counter() - begun})
    if problem is not None:
        return 1
    return _Server(control).serve()


if __name__ == "__main__":
    os.chdir(Path("/"))
    sys.exit(main())
