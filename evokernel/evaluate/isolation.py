"""How a candidate's process is confined, and what the machine allowed of it.

A candidate's process (its build, its host code, its kernels) starts in new PID,
mount and network namespaces (``unshare``) and then, before it imports anything of
the candidate, confines itself (:func:`confine`):

- every file system read-only, but for private ``/tmp`` and ``/dev/shm`` (tmpfs, bounded
  in size): nothing it writes outlives it or reaches another process, and its scratch,
  caches and ``HOME`` live there (one exception, decided by the judge: the Triton kernels
  a process running a shipped seed's exact code compiled, which the judge copies into its
  store, bound read-only into every process: triton_store.py); System V IPC and ptys of
  its own;
- ``/proc`` shows only its own namespace: no other process, no other environment;
- no network at all (a loopback that is down);
- an unprivileged user (``nobody``) with no capabilities and ``no_new_privs``, so
  it cannot write the run directory, the build cache or the judge's files, cannot
  re-enter the host's namespaces with ``setns``, and cannot regain privileges;
- when its namespace's first process dies, the kernel kills every descendant, so
  nothing it started outlives the evaluation (a ``setsid`` grandchild included);
- an environment built from a short allow-list: no keys, tokens or passwords;
- a seccomp filter: no kernel keyrings (a user's keyring is shared by all its processes),
  no inotify, fanotify or io_uring, and file locks that lock nothing (a lock on, or a watch of, a file of the
  shared root is seen by every process);
- at most ``TASK_LIMIT`` processes and threads (its PID namespace's ``pid_max``): every
  task of the host shares one count (the pid space, a container's pids limit), and the
  judge needs some of it;
- the first choice of the kernel's OOM killer (``oom_score_adj`` 1000, which it and its
  children cannot lower): its address space is bounded, the sum of its children's is not,
  and the killer otherwise takes the process holding the most memory, the judge.

What the machine refused is recorded, never silently dropped: :func:`probe`
returns an :class:`Isolation` whose ``describe()`` goes into every evaluation's
environment record, and a missing layer is logged as a warning.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import logging
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

UNSHARE_FLAGS = ("--pid", "--fork", "--mount", "--net", "--ipc", "--mount-proc", "--kill-child")
NOBODY = 65534
FILE_LIMIT = 256 * 2**20
"""Largest file a candidate's process may write (its log included)."""
CONFINE_VARIABLE = "EVOKERNEL_CONFINE"
TRITON_KERNELS_VARIABLE = "EVOKERNEL_TRITON_KERNELS"
"""The judge's store of compiled seed kernels (triton_store.py): a host folder in the
environment the judge gives a process, bound read-only at ``TRITON_KERNELS_MOUNT`` of its
scratch by ``confine``, which points the variable there."""
TRITON_KERNELS_MOUNT = "triton_kernels"
SCRATCH = "/tmp/scratch"
"""A confined process's scratch folder (its working folder, caches and ``HOME``), in its
private ``/tmp``, where it has namespaces."""
PRIVATE_TRITON_CACHE = SCRATCH.lstrip("/") + "/triton_cache_dir"
"""A namespaced process's Triton cache (its ``TRITON_CACHE_DIR``, set by ``confine``), from
its root: where the judge reads what a trusted process compiled (triton_store.py)."""
TASK_LIMIT = 4096
"""Most processes and threads alive at once in one confined process's PID namespace (its
``pid_max``; far more than torch, a compiler pool or CUDA start). The host's tasks are one
count shared by every process: a candidate that took them all (threads with small stacks
pass the screen) left the judge unable to start the thread that kills it (red team 8's
``takes_every_task.py``)."""
PID_MAX = "/proc/sys/kernel/pid_max"
OOM_SCORE_ADJ = 1000
"""A confined process's ``oom_score_adj`` (the most): the OOM killer takes it, and every
child it forks, before any process of the judge. Children that each held a little less
than the judge, together more than a memory cgroup of 5 GiB, got the judge killed (red team
8's ``starves_the_judge.py``). An unprivileged process cannot lower it."""

_ALLOWED = re.compile(
    r"^(PATH|LANG|LC_[A-Z]+|LD_LIBRARY_PATH|PYTHONPATH|CUDA_VISIBLE_DEVICES|CUDA_HOME|CUDA_PATH"
    r"|NVIDIA_[A-Z_]+|NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS"
    r"|OMP_NUM_THREADS|MKL_NUM_THREADS|TRITON_PTXAS_PATH|TRITON_LIBCUDA_PATH)$"
)
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


@dataclass(frozen=True)
class Isolation:
    """Which layers of confinement a candidate's process gets on this machine."""

    namespaces: bool
    """Own PID, mount and network namespaces (private /tmp, /dev/shm and /proc)."""
    unprivileged: bool
    """Runs as ``nobody`` with no capabilities (only when the judge runs as root)."""
    memory_limit_gb: float | None
    """Address-space limit, CPU processes only (CUDA maps far more than it uses)."""
    call_filter: bool = False
    """The seccomp filter of ``_filter_calls`` (only where this machine's system call
    numbers are known here)."""
    task_limit: bool = False
    """At most ``TASK_LIMIT`` tasks in its PID namespace (Linux 6.14+ lets a PID
    namespace have a ``pid_max`` of its own; ``task_limit_permitted``)."""

    @property
    def sealed(self) -> bool:
        """Own namespaces and the unprivileged user: what the process can write is its own,
        the host it reaches read-only, and no other candidate's process can reach it (what
        the judge's store of Triton kernels needs: triton_store.py)."""
        return self.namespaces and self.unprivileged

    def describe(self) -> str:
        layers = []
        layers.append("pid+mount+net namespaces" if self.namespaces else "NO namespaces")
        layers.append("user nobody" if self.unprivileged else "SAME USER as the judge")
        if self.memory_limit_gb:
            layers.append(f"{self.memory_limit_gb:g} GB address space")
        layers.append("seccomp filter" if self.call_filter else "NO seccomp filter")
        layers.append(f"at most {TASK_LIMIT} tasks" if self.task_limit else "NO task limit")
        return ", ".join(layers)


@functools.cache
def namespaces_permitted() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        done = subprocess.run([unshare, *UNSHARE_FLAGS, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def task_limit_permitted() -> bool:
    """Whether a new PID namespace can be given a ``pid_max`` of its own (Linux 6.14+)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    script = f"echo {TASK_LIMIT} > {PID_MAX} && [ \"$(cat {PID_MAX})\" = {TASK_LIMIT} ]"
    try:
        done = subprocess.run([unshare, *UNSHARE_FLAGS, "sh", "-c", script],
                              capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def probe(want: bool = True, memory_limit_gb: float | None = None) -> Isolation:
    """The confinement this machine permits (``want=False``: none, on purpose)."""
    if not want:
        log.warning("candidate processes run WITHOUT confinement (isolation disabled)")
        return Isolation(False, False, memory_limit_gb)
    namespaces = namespaces_permitted()
    # As nobody the process must still read Python and its packages: where they sit in a
    # folder nobody may enter (/root), only a mount namespace can re-expose them.
    unprivileged = os.geteuid() == 0 and (namespaces or not any(
        _closed_ancestor(p) for p in _needed_paths()))
    isolation = Isolation(namespaces, unprivileged, memory_limit_gb,
                          call_filter=platform.machine() in FILTERED_CALLS,
                          task_limit=namespaces and task_limit_permitted())
    if not (namespaces and unprivileged and isolation.call_filter and isolation.task_limit):
        log.warning("candidate processes are only partly confined here: %s", isolation.describe())
    return isolation


def package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def child_environment(isolation: Isolation, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed environment of a candidate's process (no secrets by construction)."""
    env = {k: v for k, v in os.environ.items() if _ALLOWED.match(k) and not _SECRET.search(k)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root(), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[CONFINE_VARIABLE] = json.dumps(asdict(isolation))
    env.update(extra or {})
    return env


def command(isolation: Isolation, module: str, *args: str) -> list[str]:
    """The argv that starts ``python -m module`` with this isolation."""
    prefix: list[str] = []
    if isolation.namespaces:
        unshare = shutil.which("unshare")
        assert unshare is not None
        prefix = [unshare, *UNSHARE_FLAGS]
    return [*prefix, sys.executable, "-m", module, *args]


# -- inside the child -------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class SystemCalls(NamedTuple):
    """One machine's numbers for the seccomp filter (``_filter_calls``)."""

    abi: int
    """``AUDIT_ARCH_*``: calls of any other ABI are refused."""
    add_key: int
    keyctl: int
    refused: tuple[int, ...]
    """Keyrings (add_key, request_key, keyctl), inotify (init, init1, add_watch),
    fanotify (init, mark) and io_uring (setup, enter, register)."""
    fcntl: int
    flock: int
    fanotify_init: int
    flagged: tuple[int, ...]
    """clone and unshare: their first argument's flags may ask for a user namespace."""
    clone3: int
    """Its flags are in memory, out of a filter's reach: refused with ENOSYS (the C library
    falls back to clone)."""


FILTERED_CALLS = {
    "x86_64": SystemCalls(0xC000003E, 248, 250, (248, 249, 250, 253, 294, 254, 300, 301, 425, 426, 427), 72, 73,
                          300, (56, 272), 435),
    "aarch64": SystemCalls(0xC00000B7, 217, 219, (217, 218, 219, 26, 27, 262, 263, 425, 426, 427), 25,
                           32,
                           262, (220, 97), 435),
}
LOCK_COMMANDS = (6, 7, 37, 38)
"""fcntl's F_SETLK, F_SETLKW, F_OFD_SETLK and F_OFD_SETLKW."""
_X32_CALL = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIGKILL = 9


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


_MS_BIND = 4096
_MS_REC = 16384
_SYS_MOUNT_SETATTR = 442  # x86-64 and arm64 alike
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
WORLD_WRITABLE = ("/var/tmp", "/run/lock", "/var/lock", "/dev/mqueue", "/run/shm")
"""Where a process could leave files for another one, if the root could not be made read-only."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _set_read_only(path: str, read_only: bool) -> bool:
    """Set or clear read-only on the mount at ``path`` and all below it (Linux 5.12+)."""
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0) if read_only else _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
    done = _libc().syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE,
                           ctypes.byref(attr), ctypes.sizeof(attr))
    return bool(done == 0)


WRITABLE_MOUNTS = ("/dev", "/proc", "/sys")
"""Left writable under the read-only root: CUDA fails to start where /dev or /proc and
/sys are read-only (seen on the H200: benchmarks/probe_confinement_gpu.py); an
unprivileged process can write little there but its own /proc entries, and /dev's
shared folders are covered below."""


def _read_only_root() -> bool:
    """Every mount read-only but /dev (whose world-writable folders get a private tmpfs);
    False where the kernel cannot (before 5.12)."""
    if not _set_read_only("/", True):
        return False
    for path in WRITABLE_MOUNTS:
        if os.path.ismount(path):
            _set_read_only(path, False)
    for folder in ("/dev/mqueue",):
        if os.path.isdir(folder):
            _mount_tmpfs(folder, size="1m")
    return True


def _mount_tmpfs(target: str, mode: str = "1777", size: str = "4g", inodes: str = "64k") -> None:
    """A private tmpfs, bounded in bytes and in files: an empty file takes no bytes of
    ``size`` but about 1 KB of kernel memory, which no limit of the process counts (tens
    of millions, made in one build's time limit, would fill a CPU host's memory), and the
    kernel frees them one by one as the process dies (a million took 2.6 s on a CPU
    host; the next candidate's clocked batches wait for that death: red team 7)."""
    options = f"mode={mode},size={size},nr_inodes={inodes}".encode()
    if _libc().mount(b"tmpfs", target.encode(), b"tmpfs", 0, options) != 0:
        raise OSError(ctypes.get_errno(), f"mounting a private tmpfs on {target} failed")


def _private_ptys() -> None:
    """A devpts instance of its own on /dev/pts (where /dev/ptmx finds it): the host's
    is one for every mount namespace, and a pty opened there shows to every process as
    /dev/pts/N, readable by any process of its owner's user (every candidate's is
    ``nobody``). A dying candidate left answers buffered in ptys that the next one,
    loading meanwhile, read (red team 7). Where devpts cannot be mounted, a tmpfs
    covers /dev/pts: no ptys at all."""
    options = b"newinstance,ptmxmode=0666,mode=0620"
    if _libc().mount(b"devpts", b"/dev/pts", b"devpts", 0, options) != 0:
        _mount_tmpfs("/dev/pts", "0755", "1m")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _filter_calls() -> bool:
    """A seccomp filter on the process's system calls (it needs ``no_new_privs``), for
    what namespaces leave shared between every candidate's processes (all ``nobody``):

    - the kernel's keyrings are refused (EPERM): a user's keyring is shared by all its
      processes whatever their namespaces, and outlives them (caches_in_keyring.py
      served answers a process before it had left there);
    - file locks (flock, and fcntl's lock-setting commands) succeed without locking: a
      lock on a file of the shared read-only root is seen by every process that opens
      it, and an open file's lock lives until the kernel releases the file, late in a
      dying process's exit, while the next candidate already loads (a dying process
      left thousands of ranges locked, each carrying two numbers, for the next to read:
      red team 7). Within one process a lock then excludes nothing;
    - inotify is refused: a watch on a file of the shared root sees every process's
      opens and closes of it, a dying one's included (a dying process held open the
      files whose closes spelled a message for the next candidate: red team 7); and so
      is fanotify, which an unprivileged process may use too (inode marks, Linux 5.13+)
      and which sees the same closes (red team 9's ``watches_closes_fanotify.py``);
    - no user namespace (clone and unshare with CLONE_NEWUSER are refused, clone3 answers
      ENOSYS): an unprivileged process may make one (a forked child: only a multithreaded
      process is refused), and in it mount what it likes, a tmpfs with no bound on its
      files included, whose kernel memory no limit counts and whose freeing makes its
      death as slow as it likes (red team 9's ``mounts_own_tmpfs.py``);
    - io_uring is refused: no honest kernel needs it, and its rings are torn down by a
      kernel worker after the process is reaped, work the judge could not wait for
      (red team 9: no attack built, a door shut);
    - every call of another ABI than the machine's is refused (its numbers mean other
      calls).

    False where the machine's numbers are not known here (then nothing is filtered)."""
    known = FILTERED_CALLS.get(platform.machine())
    if known is None:
        return False
    load, equal, at_least, give = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JEQ, JGE, RET (K)
    masked = 0x54  # BPF_ALU|AND|K
    allow, pretend, deny = 0x7FFF0000, 0x00050000, 0x00050000 | errno.EPERM  # _ALLOW, _ERRNO
    unknown = 0x00050000 | errno.ENOSYS
    # (code, k, where to go if true, if false): a label, or None for the next step
    steps: list[tuple[str, int, int, str | None, str | None]] = [
        ("", load, 4, None, None),  # seccomp_data.arch
        ("", equal, known.abi, None, "deny"),
        ("", load, 0, None, None),  # seccomp_data.nr
        ("", at_least, _X32_CALL, "deny", None),  # the x32 ABI of x86-64
        *(("", equal, call, "deny", None) for call in known.refused),
        ("", equal, known.clone3, "unknown", None),
        *(("", equal, call, "flagged", None) for call in known.flagged),
        ("", equal, known.flock, "pretend", None),
        ("", equal, known.fcntl, None, "allow"),
        ("", load, 24, None, None),  # the low half of seccomp_data.args[1]: the command
        *(("", equal, command, "pretend", None) for command in LOCK_COMMANDS),
        ("allow", give, allow, None, None),
        ("flagged", load, 16, None, None),  # the low half of seccomp_data.args[0]: the flags
        ("", masked, CLONE_NEWUSER, None, None),
        ("", equal, 0, None, "deny"),
        ("", give, allow, None, None),
        ("pretend", give, pretend, None, None),
        ("deny", give, deny, None, None),
        ("unknown", give, unknown, None, None),
    ]
    at = {label: i for i, (label, *_) in enumerate(steps) if label}
    program = [_SockFilter(code, 0 if yes is None else at[yes] - i - 1,
                           0 if no is None else at[no] - i - 1, k)
               for i, (_, code, k, yes, no) in enumerate(steps)]
    filters = (_SockFilter * len(program))(*program)
    fprog = _SockFprog(len(program), filters)
    if _libc().prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "installing the seccomp filter failed")
    return True


def _limit_tasks() -> None:
    """``TASK_LIMIT`` as this PID namespace's ``pid_max`` (its own /proc; needs the
    privilege the process has before it drops to ``nobody``)."""
    with open(PID_MAX, "w") as f:
        f.write(str(TASK_LIMIT))
    with open(PID_MAX) as f:
        if int(f.read()) != TASK_LIMIT:
            raise OSError(f"{PID_MAX} did not take {TASK_LIMIT}")


def _bind(source: str, target: str) -> None:
    if _libc().mount(source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind-mounting {source} on {target} failed")


def _needed_paths() -> set[str]:
    """What the process must still read as ``nobody``: Python, its packages, evokernel."""
    paths = {sys.base_prefix, sys.prefix, package_root(), os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.exists(p))
    return {os.path.realpath(p) for p in paths}


def _closed_ancestor(path: str) -> str | None:
    """The topmost folder above ``path`` that other users cannot enter (e.g. /root)."""
    parts = Path(path).parts
    for i in range(1, len(parts)):
        folder = str(Path(*parts[:i]))
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


PRIVATE_FOLDERS = ("/tmp", "/dev/shm")
"""Replaced by a private tmpfs in every confined process."""


def _hidden_needs(masks: Sequence[str]) -> list[str]:
    """The needed paths that a tmpfs over ``masks`` would hide (a package under /tmp,
    Python under /root), outermost first and none inside another."""
    hidden = [p for p in sorted(_needed_paths()) if os.path.isdir(p)
              and any(p == m or p.startswith(m + os.sep) for m in masks)]
    return [p for p in hidden if not any(p != q and p.startswith(q + os.sep) for q in hidden)]


def cover_and_reexpose(unprivileged: bool) -> list[str]:
    """Private tmpfs over /tmp and /dev/shm and, for an unprivileged process, over every
    folder it could not enter (the judge's home); the paths Python needs that lie under
    them are bound back in place. Needs the mount namespace; returns what was covered."""
    closed = sorted({c for p in _needed_paths() if (c := _closed_ancestor(p)) is not None})
    masks = [*PRIVATE_FOLDERS, *(closed if unprivileged else [])]
    keep = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in _hidden_needs(masks)}
    for folder in PRIVATE_FOLDERS:
        if folder == "/dev/shm":
            _mount_tmpfs(folder, size="1g")
        else:  # scratch, caches and builds: files enough for any compiler
            _mount_tmpfs(folder, size="4g", inodes="1m")
    for folder in masks[len(PRIVATE_FOLDERS):]:
        _mount_tmpfs(folder, "0755", "1m")
    for path, fd in keep.items():  # mount follows /proc/self/fd/N to the folder it holds
        os.makedirs(path, mode=0o755, exist_ok=True)
        _bind(f"/proc/self/fd/{fd}", path)
        os.close(fd)
    return masks


def confine() -> Path:
    """Confine the current process as the judge asked; returns its scratch folder.

    Called by a candidate's process first thing, before torch or any candidate code
    is imported. Raises if a layer the judge was promised cannot be applied: a
    process that is less confined than recorded must not run.
    """
    isolation = Isolation(**json.loads(os.environ.pop(CONFINE_VARIABLE, "{}") or "{}")) \
        if os.environ.get(CONFINE_VARIABLE) else Isolation(False, False, None)
    libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    # held open before any folder is covered: the store may lie under the judge's home
    kernels = _open_store(os.environ.pop(TRITON_KERNELS_VARIABLE, ""), isolation)
    with open("/proc/self/oom_score_adj", "w") as f:  # any process may raise its own
        f.write(str(OOM_SCORE_ADJ))
    if isolation.namespaces:
        if not _read_only_root():
            for folder in WORLD_WRITABLE:  # an older kernel: cover what others could write
                if os.path.isdir(folder) and not os.path.islink(folder):
                    _mount_tmpfs(folder, size="1m")
        cover_and_reexpose(isolation.unprivileged)
        if os.path.isdir("/dev/pts"):
            _private_ptys()
        if isolation.task_limit:  # promised: a process that cannot have it must not run
            _limit_tasks()
        scratch = Path(SCRATCH)
    else:
        import tempfile

        scratch = Path(tempfile.mkdtemp(prefix="evokernel-candidate-"))
    scratch.mkdir(parents=True, exist_ok=True)
    if kernels is not None:
        with contextlib.suppress(OSError):  # an optimisation: without it Triton compiles all here
            _bind_store(kernels, scratch / TRITON_KERNELS_MOUNT)
    if isolation.memory_limit_gb:
        limit = int(isolation.memory_limit_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Its output goes to a log file the judge opened: bound what it can write there.
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    if isolation.unprivileged:
        os.chown(scratch, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        if os.getuid() != NOBODY or os.geteuid() != NOBODY:
            raise OSError("could not drop to the unprivileged user")
        if isolation.namespaces:  # a change of user clears it: again, so that the namespace's
            # first process dies with its parent (unshare, or the fork server's keeper), a
            # single-threaded process (without namespaces the parent may be a judge's thread)
            libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if isolation.call_filter and not _filter_calls():
        raise OSError("the seccomp filter the judge recorded is not known on this machine")
    os.chdir(scratch)
    for name in ("HOME", "TMPDIR", "TRITON_CACHE_DIR", "CUPY_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                 "XDG_CACHE_HOME"):
        place = scratch / name.lower()
        place.mkdir(exist_ok=True)
        os.environ[name] = str(place)
    return scratch


def _open_store(folder: str, isolation: Isolation) -> int | None:
    """A descriptor of the judge's Triton store, where it gave one and the process is
    fully confined (a mount namespace to bind it in, the unprivileged user that cannot
    write it); None otherwise (Triton then compiles everything itself)."""
    if not folder or not isolation.sealed:
        return None
    try:
        return os.open(folder, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None


def _bind_store(descriptor: int, target: Path) -> None:
    """Bind the store (held by ``descriptor``) read-only at ``target`` and point
    ``TRITON_KERNELS_VARIABLE`` there (the descriptor is closed). Its files belong to the
    judge's user and are not writable by others: read-only is a second lock (refused
    before Linux 5.12)."""
    try:
        target.mkdir(exist_ok=True)
        _bind(f"/proc/self/fd/{descriptor}", str(target))
    finally:
        os.close(descriptor)
    if not _set_read_only(str(target), True):  # before Linux 5.12: its owner's files all the same
        print(f"the Triton store at {target} is bound without the read-only flag (a kernel before "
              "5.12): only its files' owner, the judge's user, may write them", file=sys.stderr)
    os.environ[TRITON_KERNELS_VARIABLE] = str(target)


FILE_PROBE = 70_000
"""Files ``report`` tries to make in /dev/shm (more than its tmpfs allows)."""


def _count_tasks(most: int) -> int:
    """Threads this process can start, up to ``most`` (all let go before it returns)."""
    import threading

    release = threading.Event()
    started: list[threading.Thread] = []
    threading.stack_size(64 * 1024)
    try:
        for _ in range(most):
            thread = threading.Thread(target=release.wait, daemon=True)
            thread.start()
            started.append(thread)
    except RuntimeError:
        pass
    finally:
        threading.stack_size(0)
        release.set()
    for thread in started:
        thread.join()
    return len(started)


def _try_user_namespace() -> str:
    """Whether a forked (single-threaded) child of this process can make a user namespace."""
    child = os.fork()
    if child == 0:
        os._exit(0 if _libc().unshare(CLONE_NEWUSER) == 0 else 1)
    _, status = os.waitpid(child, 0)
    return "made" if os.waitstatus_to_exitcode(status) == 0 else "refused"


def report() -> dict[str, object]:
    """What a confined process sees (``python -m evokernel.evaluate.isolation``, as a child).

    Run it through :func:`command` with :func:`child_environment` to check a machine:
    its user, the processes and network interfaces it can see, the environment it got,
    and whether the judge's user's home is readable.
    """
    scratch = confine()
    return {**observe(), "scratch": str(scratch)}


def observe() -> dict[str, object]:
    """What this process sees of the host, for :func:`report` (after it confined
    itself) and for tests of the processes the fork server makes (after theirs)."""
    import socket

    processes = [p for p in os.listdir("/proc") if p.isdigit()]
    try:
        interfaces = [name for _, name in socket.if_nameindex()]
    except OSError:
        interfaces = []
    writable = []
    for folder in ("/var/tmp", "/run/lock", "/tmp", "/dev/shm", "/"):
        try:
            with open(os.path.join(folder, f".probe-{os.getpid()}"), "w") as f:
                f.write("x")
            writable.append(folder)
        except OSError:
            pass
    try:
        os.openpty()  # one of its own: then every pty it can see
        ptys = sorted(name for name in os.listdir("/dev/pts") if name.isdigit())
    except OSError:
        ptys = []
    made = 0  # files it can make in /dev/shm (each costs kernel memory; bounded)
    try:
        for made in range(FILE_PROBE):
            open(f"/dev/shm/.probe-{made}", "w").close()
        made = FILE_PROBE
    except OSError:
        pass
    for i in range(made):
        os.unlink(f"/dev/shm/.probe-{i}")
    locks = "none"  # a lock on a shared file, as another open file of it sees it
    try:
        import fcntl
        import struct

        shared = [os.open(sys.executable, os.O_RDONLY) for _ in range(2)]
        fcntl.fcntl(shared[0], fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 7, 1, 0))
        seen = fcntl.fcntl(shared[1], fcntl.F_OFD_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        if struct.unpack("hhqqi", seen)[0] != fcntl.F_UNLCK:
            locks = "held"
        for fd in shared:
            os.close(fd)
    except (OSError, AttributeError) as exc:
        locks = f"untested: {exc}"
    inotify = "refused" if _libc().inotify_init1(0) < 0 else "allowed"
    user_namespace = _try_user_namespace()
    fanotify = io_uring = "not known on this machine"
    tasks = _count_tasks(TASK_LIMIT + 512)
    keyring = "not known on this machine"
    known = FILTERED_CALLS.get(platform.machine())
    if known is not None:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        key = libc.syscall(known.add_key, b"user", b"evokernel-probe", b"x", 1, -4)  # user's
        keyring = "refused" if key < 0 else "written"
        group = libc.syscall(known.fanotify_init, 0x200, os.O_RDONLY)  # FAN_REPORT_FID: unprivileged
        fanotify = "refused" if group < 0 else "allowed"
        if group >= 0:
            os.close(group)
        params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
        ring = libc.syscall(425, 1, params)  # io_uring_setup: the same number on both machines
        io_uring = "refused" if ring < 0 else "allowed"
        if ring >= 0:
            os.close(ring)
        if key >= 0:
            libc.syscall(known.keyctl, 21, ctypes.c_long(key))  # KEYCTL_INVALIDATE: leave none
    store = os.environ.get(TRITON_KERNELS_VARIABLE, "")
    triton_store: dict[str, object] | None = None
    if store:  # the judge's store of seed kernels, as this process sees it
        try:
            listing: object = sorted(os.listdir(store))
        except OSError as exc:
            listing = f"unreadable: {exc.strerror}"
        try:
            with open(os.path.join(store, ".probe"), "w") as f:
                f.write("x")
            os.unlink(os.path.join(store, ".probe"))  # leave nothing in the judge's store
            store_writable = True
        except OSError:
            store_writable = False
        triton_store = {"at": store, "listing": listing, "writable": store_writable}
    home_readable = True
    try:
        os.listdir("/root")
    except OSError:
        home_readable = False
    return {
        "uid": os.getuid(), "euid": os.geteuid(), "pid": os.getpid(),
        "visible_processes": len(processes), "interfaces": interfaces, "ptys": ptys,
        "keyring": keyring, "shm_files": made, "file_locks": locks, "inotify": inotify,
        "fanotify": fanotify, "io_uring": io_uring, "user_namespace": user_namespace,
        "threads": tasks, "oom_score_adj": int(Path("/proc/self/oom_score_adj").read_text()),
        "environment": sorted(os.environ), "writable": writable,
        "root_home_listing": os.listdir("/root") if home_readable else None,
        "arguments": sys.argv[1:], "triton_store": triton_store,
        "sockets": sorted(int(fd) for fd in os.listdir("/proc/self/fd")
                          if _link(f"/proc/self/fd/{fd}").startswith("socket:")),
    }


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


if __name__ == "__main__":
    print(json.dumps(report()))
