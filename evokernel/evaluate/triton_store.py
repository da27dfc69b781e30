"""Compiled Triton kernels of the shipped seeds, shared read-only with candidate processes.

A Triton candidate compiles its kernels in its own process, on its first calls: every
knob variant of a seed pays every compile again, though most of its kernels are the
seed's. On an H200 (2026-12-06) a point of the fused_moe landscape took 14.7 s, 14 of them
Triton's compiles. This store keeps what processes running *shipped seed code* compiled,
so that later processes find those kernels ready:

- Only the judge writes the store, and only from a process whose candidate's sources,
  entry point and parameter spaces are byte for byte a shipped seed's (``trusts``), of
  any language (a CUDA seed may hand some batches to a Triton pipeline it ships): such a
  process ran evokernel's code, the seed's and Triton's, nothing a search or an LLM
  wrote, so what it compiled is what Triton makes of that code. Its parameter values
  are among the seed's declared choices, of their declared types, and Triton's cache key
  covers the source, the constants and the target: no entry can answer for another
  kernel.
- The judge copies the entries (``admit``) from the process's private ``/tmp`` while the
  process is alive and idle, before it is killed, through ``/proc/<pid>/root``: nothing of
  the store is ever writable by a candidate's process, and no process's files reach the
  host's disk but through that copy.
- Every candidate process sees the store read-only in its scratch
  (``isolation.confine`` binds it) and Triton looks there first (``triton_reader``),
  then in its private cache.
- Entries are checked as they are copied (regular files of plain names, bounded sizes,
  whole groups only), not trusted: a cached kernel is only ever a build, and every
  evaluation still checks what it computes.

It needs the full confinement (namespaces and the unprivileged user): without it a
candidate's process could write the store or the process being copied.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import stat
import sysconfig
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from evokernel.candidate import Candidate
from evokernel.evaluate.isolation import PRIVATE_TRITON_CACHE as PRIVATE_CACHE
from evokernel.evaluate.isolation import TRITON_KERNELS_VARIABLE as KERNELS_VARIABLE
from evokernel.files import process_alive

log = logging.getLogger(__name__)

__all__ = ["KERNELS_VARIABLE", "MANAGER_VARIABLE", "PRIVATE_CACHE", "READER", "TritonStore"]

MANAGER_VARIABLE = "TRITON_CACHE_MANAGER"
READER = "evokernel.evaluate.triton_reader:StoreFirstCacheManager"
"""Triton's cache manager in every candidate process (``TRITON_CACHE_MANAGER``)."""
ENTRY_NAME = re.compile(r"^[A-Z2-7]{16,64}$")
"""Triton's cache folders: the base32 of a SHA-256 (``triton.runtime.cache._base32``)."""
FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,200}$")
FILE_LIMIT = 64 << 20
"""Largest file of an entry taken (cubins, launchers and IR are well under)."""
ENTRY_FILES = 64
"""Most files of an entry (a compile leaves about ten: IR stages, binary, metadata, group)."""
ENTRY_LIMIT = 256 << 20
"""Most bytes of one entry."""
MODULE_STEM = re.compile(r"^[A-Za-z0-9_]+$")
"""The name of a module Triton built, before the interpreter's suffix (``__triton_launcher``)."""
ADMIT_LIMIT = 1 << 30
"""Most bytes one admission copies."""
STORE_LIMIT = 8 << 30
"""Most bytes the store holds; beyond it, nothing more is admitted. An evaluator counts
what the store held when it started and what it added since (evaluators sharing a store
may together go past it)."""
STAGED = ".staged-"
"""The prefix of an admission's folder in the store: ``.staged-<pid>-<random>``."""


def _bytes_under(folder: Path) -> int:
    """The bytes of the files under ``folder``, as far as they can be read (another
    evaluator sharing the store may be landing or clearing entries meanwhile)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def fingerprint(candidate: Candidate) -> str:
    """What must equal a shipped seed's for a candidate's process to be trusted: its code
    and the spaces its parameter values come from (not the values, nor its history)."""
    return json.dumps({
        "language": candidate.language.value,
        "entry_point": candidate.entry_point,
        "sources": dict(sorted(candidate.sources.items())),
        "knob_space": {k: v.model_dump(mode="json") for k, v in sorted(candidate.knob_space.items())},
        "launch_space": {k: v.model_dump(mode="json") for k, v in sorted(candidate.launch_space.items())},
        "constraints": list(candidate.constraints),
    }, sort_keys=True)


class TritonStore:
    """The store's folder, ``<root>/kernels``; ``root`` is made readable by its owner only,
    so that a candidate's process reaches the kernels through its read-only bind alone.

    The evaluator makes one where candidate processes are fully confined
    (``Isolation.sealed``), gives every process its ``environment``, asks ``trusts``
    before a candidate is loaded, and calls ``admit`` for a trusted one's process once
    its evaluation is over, before it is killed (``SandboxEvaluator._retire``, in the
    lane's retiring thread).

    Thread safety: ``admit`` may be called from several threads (the lanes' retiring):
    one admission at a time (a lane's next candidate may wait for another lane's copy);
    each entry lands by one ``rename``, and a name already taken keeps the first (a store
    shared by evaluators in other processes included).

    Args:
        root: The store's folder (the evaluator's build cache's ``triton``).
        seeds: The workload's shipped seeds (``Workload.seeds()``): their code is what a
            trusted process runs.
    """

    def __init__(self, root: Path, seeds: Iterable[Candidate]) -> None:
        self.root = Path(root)
        self.kernels = self.root / "kernels"
        self.kernels.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(self.kernels, 0o755)
        self._seeds = {fingerprint(s): s for s in seeds}
        _clear_abandoned(self.kernels)
        self._bytes = _bytes_under(self.kernels)
        self._lock = threading.Lock()
        self._refused = False
        """Whether reading a process's files was refused (said once)."""
        self._full = False
        """Whether the store was found full (said once)."""
        self.admitted = 0
        """Entries admitted by this store so far."""
        self.offered = 0
        """Entries found in trusted processes' own caches so far, admitted or not: what
        they compiled themselves (a process that found everything in the store offers
        none)."""

    def environment(self) -> dict[str, str]:
        """What every candidate process's environment gets: the store and the reader."""
        return {KERNELS_VARIABLE: str(self.kernels), MANAGER_VARIABLE: READER}

    def trusts(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` is a shipped seed's code, its values among the seed's
        declared choices and of their types (``Candidate`` checks values by equality: 4.0
        passes for 4 and True for 1, values the seed never declared)."""
        seed = self._seeds.get(fingerprint(candidate))
        if seed is None:
            return False
        space = {**seed.knob_space, **seed.launch_space}
        return all(any(type(value) is type(choice) and value == choice for choice in space[name].choices)
                   for name, value in candidate.params.items())

    def admit(self, root: Path, cache: str, alive: Callable[[], bool]) -> int:
        """Copy the complete entries of the folder ``cache`` under ``root`` that the store
        lacks. The evaluator calls it with a trusted process's root as the judge sees it
        (``/proc/<pid>/root``) and ``PRIVATE_CACHE``, while that process lives and is idle
        (its evaluation over, before its kill); ``alive`` says whether it still lives: if it
        died before the copy is over, its number may be another process's by then, and
        nothing is admitted. Returns the entries added; raises OSError where the store
        cannot be written."""
        with self._lock:
            staged = self.kernels / f"{STAGED}{os.getpid()}-{uuid.uuid4().hex}"
            staged.mkdir(mode=0o755)
            try:
                names = self._stage(root, cache, staged, min(ADMIT_LIMIT, STORE_LIMIT - self._bytes))
                if not alive():
                    log.warning("a trusted candidate process died while its Triton kernels "
                                "were copied: none were kept")
                    return 0
                added = 0
                for name, size in names:
                    try:
                        os.rename(staged / name, self.kernels / name)
                    except OSError:  # another evaluator's copy of the same entry came first
                        continue
                    added += 1
                    self._bytes += size
                self.admitted += added
                return added
            finally:
                shutil.rmtree(staged, ignore_errors=True)

    def _stage(self, root: Path, cache: str, staged: Path, budget: int) -> list[tuple[str, int]]:
        """Copy the acceptable entries of ``cache`` under ``root`` that the store lacks into
        ``staged``, at most ``budget`` bytes: (name, bytes) each."""
        kept: list[tuple[str, int]] = []
        try:
            source = _open_beneath(root, cache)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM) and not self._refused:
                self._refused = True  # said once: every later process would say the same
                log.warning("the judge may not read a candidate process's files (%s): the "
                            "Triton store gets no new kernels (reading another user's "
                            "process's root needs CAP_SYS_PTRACE)", exc)
            return kept
        try:
            for name in sorted(os.listdir(source)):
                if not ENTRY_NAME.match(name):
                    continue
                if (self.kernels / name).exists():
                    self.offered += _holds_files(source, name)
                    continue
                files = _entry_files(source, name)
                if files is None:
                    continue
                self.offered += 1
                size = sum(len(data) for data in files.values())
                if size > budget:
                    if not self._full:
                        self._full = True
                        log.warning("the Triton store holds %d bytes: no more kernels are kept "
                                    "(triton_store.STORE_LIMIT)", self._bytes)
                    continue
                budget -= size
                folder = staged / name
                folder.mkdir(mode=0o755)
                for file, data in files.items():
                    (folder / file).write_bytes(data)
                    os.chmod(folder / file, 0o644)
                kept.append((name, size))
        finally:
            os.close(source)
        return kept


def _clear_abandoned(kernels: Path) -> None:
    """Remove the admissions' folders that a judge which has died left in the store
    (another evaluator's live one is kept: its process still runs)."""
    for left in kernels.glob(f"{STAGED}*"):
        pid = left.name.removeprefix(STAGED).partition("-")[0]
        if pid.isdigit() and process_alive(int(pid)):
            continue
        shutil.rmtree(left, ignore_errors=True)


def _holds_files(root: int, name: str) -> bool:
    """Whether the folder ``name`` of ``root`` (a descriptor) holds anything: Triton makes
    the folder of every key it looks up, and one found in the store stays empty."""
    try:
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
    except OSError:
        return False
    try:
        return bool(os.listdir(folder))
    finally:
        os.close(folder)


def _open_beneath(root: Path, relative: str) -> int:
    """A descriptor of the folder ``relative`` under ``root`` (a process's root,
    ``/proc/<pid>/root``, followed as the magic link it is), every part below it opened
    without following a link: a link in another process's tree is resolved against the
    judge's root."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(relative).parts:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _entry_files(root: int, name: str, budget: int = ENTRY_LIMIT) -> dict[str, bytes] | None:
    """The files of entry ``name`` of the folder ``root`` (a descriptor), its groups' paths
    reduced to file names; None where it is not a complete entry of plain files (empty, a
    compile in progress, a link, a pipe, a name out of the ordinary, a group naming a file
    that is missing, too many files or bytes). Triton leaves two kinds: a kernel's compile
    (its IR, binary and metadata, and a ``__grp__`` file naming them, written last) and a
    module it built with the host compiler (one ``.so``, a kernel's launcher or the
    driver's utilities, which ``get_file`` finds alone). An empty folder is what a lookup
    of a kernel found elsewhere leaves (Triton makes the folder of every key it asks for)."""
    files: dict[str, bytes] = {}
    try:
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
    except OSError:
        return None
    try:
        names = os.listdir(folder)
        if not names or len(names) > ENTRY_FILES:
            return None
        for file in names:
            if not FILE_NAME.match(file):
                return None
            # a compile's temporary folder (``tmp.pid_...``) passes the name: not a regular file
            data = _read_plain(folder, file, min(budget, FILE_LIMIT))
            if data is None:
                return None
            budget -= len(data)
            files[file] = data
    except OSError:
        return None
    finally:
        os.close(folder)
    return _reduced(files)


def _read_plain(folder: int, name: str, most: int) -> bytes | None:
    """The bytes of the regular file ``name`` of ``folder`` (a descriptor), or None where it
    is anything else (a link, a folder, a pipe: opened without blocking) or over ``most``."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > most:
            return None
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > info.st_size:
                return None  # it grew while read
            chunks.append(chunk)
        return b"".join(chunks) if total == info.st_size else None
    finally:
        os.close(fd)


def _reduced(files: dict[str, bytes]) -> dict[str, bytes] | None:
    """A whole entry with its groups naming their files by name alone, or None."""
    groups = [name for name in files if name.startswith("__grp__")]
    if not groups:
        if len(files) != 1:
            return None
        name, data = next(iter(files.items()))
        return files if _is_module(name, data) else None
    for name in groups:
        try:
            children = json.loads(files[name])["child_paths"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        if not isinstance(children, dict):
            return None
        reduced = {}
        for child, path in children.items():
            base = os.path.basename(str(path))
            if base not in files:
                return None
            reduced[child] = base
        files[name] = json.dumps({"child_paths": reduced}).encode()
    return files


def _is_module(name: str, data: bytes) -> bool:
    """A Python extension module of this interpreter (``<name><EXT_SUFFIX>``, an ELF
    file): what Triton's ``compile_module_from_src`` caches alone. An autotuner's timings
    (``*.autotune.json``, also alone) are not kept: measured beside other lanes' work, and
    keyed without the GPU."""
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")
    return (name.endswith(suffix) and MODULE_STEM.match(name[: -len(suffix)]) is not None
            and data.startswith(b"\x7fELF"))
