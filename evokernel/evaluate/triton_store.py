"""Compiled Triton kernels of the shipped seeds, shared read-only with candidate processes.

A Triton candidate compiles its kernels in its own process, on its first calls: every
knob variant of a seed pays every compile again, though most of its kernels are the
seed's. On an H200 (2026-12-06) a point of the fused_moe landscape took 14.7 s, 14 of them
Triton's compiles. This store keeps what processes running *shipped seed code* compiled,
so that later processes find those kernels ready:

- Only the judge writes the store, and only from a process whose candidate's sources,
  entry point and parameter spaces are byte for byte a shipped seed's (``trusts``): such
  a process ran evokernel's code, the seed's and Triton's, nothing a search or an LLM
  wrote, so what it compiled is what Triton makes of that code. Its parameter values
  are among the seed's declared choices (``Candidate`` checks), and Triton's cache key
  covers the source, the constants and the target: no entry can answer for another
  kernel.
- The judge copies the entries (``admit``) from the process's private ``/tmp`` while the
  process is alive and idle, before it is killed, through ``/proc/<pid>/root``: nothing of
  the store is ever writable by a candidate's process, and no process's files reach the
  host's disk but through that copy.
- Every candidate process sees the store read-only at ``/tmp/scratch/triton_kernels``
  (``isolation.confine`` binds it) and Triton looks there first (``triton_reader``),
  then in its private cache.
- Entries are checked as they are copied (regular files of plain names, bounded sizes,
  whole groups only), not trusted: a cached kernel is only ever a build, and every
  evaluation still checks what it computes.

It needs the full confinement (namespaces and the unprivileged user): without it a
candidate's process could write the store or the process being copied.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from evokernel.candidate import Candidate, Language
from evokernel.evaluate.isolation import TRITON_KERNELS_VARIABLE as KERNELS_VARIABLE

log = logging.getLogger(__name__)

__all__ = ["KERNELS_VARIABLE", "MANAGER_VARIABLE", "READER", "TritonStore"]

MANAGER_VARIABLE = "TRITON_CACHE_MANAGER"
READER = "evokernel.evaluate.triton_reader:StoreFirstCacheManager"
"""Triton's cache manager in every candidate process (``TRITON_CACHE_MANAGER``)."""
PRIVATE_CACHE = "tmp/scratch/triton_cache_dir"
"""A confined process's Triton cache, from its root (``isolation.confine``)."""
ENTRY_NAME = re.compile(r"^[A-Z2-7]{16,64}$")
"""Triton's cache folders: the base32 of a SHA-256 (``triton.runtime.cache._base32``)."""
FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,200}$")
FILE_LIMIT = 64 << 20
"""Largest file of an entry taken (cubins, launchers and IR are well under)."""
ADMIT_LIMIT = 1 << 30
"""Most bytes one admission copies."""
STORE_LIMIT = 8 << 30
"""Most bytes the store holds; beyond it, nothing more is admitted."""


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

    Thread safety: ``admit`` may be called from several threads (the lanes' retiring):
    one admission at a time; each entry lands by one ``rename``, and a name already taken
    keeps the first (a store shared by evaluators in other processes included).

    Args:
        root: The store's folder (the evaluator's build cache's ``triton``).
        seeds: The workload's shipped seeds (``Workload.seeds()``): the Triton ones are
            the candidates whose processes are trusted.
    """

    def __init__(self, root: Path, seeds: Iterable[Candidate]) -> None:
        self.root = Path(root)
        self.kernels = self.root / "kernels"
        self.kernels.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(self.kernels, 0o755)
        self._trusted = {fingerprint(s) for s in seeds if s.language is Language.TRITON}
        self._bytes = sum(f.stat().st_size for f in self.kernels.rglob("*") if f.is_file())
        self.admitted = 0
        """Entries admitted by this store so far."""
        self._lock = threading.Lock()
        self.offered = 0
        """Entries found in trusted processes' own caches so far, admitted or not: what
        they compiled themselves (a process that found everything in the store offers
        none)."""

    def environment(self) -> dict[str, str]:
        """What every candidate process's environment gets: the store and the reader."""
        return {KERNELS_VARIABLE: str(self.kernels), MANAGER_VARIABLE: READER}

    def trusts(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` is a shipped Triton seed's code (any values of its knobs)."""
        return candidate.language is Language.TRITON and fingerprint(candidate) in self._trusted

    def admit(self, cache: Path, alive: Callable[[], bool]) -> int:
        """Copy the complete entries of ``cache`` (a trusted process's Triton cache, seen
        through ``/proc/<pid>/root``) that the store lacks; ``alive`` says whether that
        process still lives: if it died before the copy is over, its number may be
        another process's by then, and nothing is admitted. Returns the entries added."""
        with self._lock:
            return self._admit(cache, alive)

    def _admit(self, cache: Path, alive: Callable[[], bool]) -> int:
        staged = self.kernels / f".staged-{uuid.uuid4().hex}"
        staged.mkdir(mode=0o755)
        try:
            budget = min(ADMIT_LIMIT, STORE_LIMIT - self._bytes)
            names = self._stage(cache, staged, budget)
            if not alive():
                log.warning("a trusted candidate process died while its Triton kernels were "
                            "copied: none were kept")
                return 0
            added = 0
            for name, size in names:
                try:
                    os.rename(staged / name, self.kernels / name)
                except OSError:  # another process's copy of the same entry came first
                    continue
                added += 1
                self._bytes += size
            self.admitted += added
            return added
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _stage(self, cache: Path, staged: Path, budget: int) -> list[tuple[str, int]]:
        """Copy the acceptable entries of ``cache`` into ``staged``: (name, bytes) each."""
        try:
            entries = sorted(os.scandir(cache), key=lambda e: e.name)
        except OSError:
            return []
        kept: list[tuple[str, int]] = []
        for entry in entries:
            if not ENTRY_NAME.match(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            self.offered += 1
            if (self.kernels / entry.name).exists():
                continue
            files = _entry_files(Path(entry.path))
            if files is None:
                continue
            size = sum(len(data) for data in files.values())
            if size > budget:
                log.warning("the Triton store is full (%d bytes): no more kernels are kept", self._bytes)
                break
            budget -= size
            folder = staged / entry.name
            folder.mkdir(mode=0o755)
            for name, data in files.items():
                (folder / name).write_bytes(data)
                os.chmod(folder / name, 0o644)
            kept.append((entry.name, size))
        return kept


def _entry_files(folder: Path) -> dict[str, bytes] | None:
    """An entry's files, its groups' paths reduced to file names, or None where it is not
    a complete entry of plain files (a compile in progress, a link, a name out of the
    ordinary, a group naming a file that is missing, a file too large). Triton leaves two
    kinds: a kernel's compile (its IR, binary and metadata, and a ``__grp__`` file naming
    them, written last) and a module it built with the host compiler (one ``.so``, the
    kernel's launcher or the driver's utilities, which ``get_file`` finds alone)."""
    files: dict[str, bytes] = {}
    try:
        for item in os.scandir(folder):
            if not item.is_file(follow_symlinks=False) or not FILE_NAME.match(item.name):
                return None  # a compile's temporary folder, a link, or a foreign name
            fd = os.open(item.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read(FILE_LIMIT + 1)
            if len(data) > FILE_LIMIT:
                return None
            files[item.name] = data
    except OSError:
        return None
    groups = [name for name in files if name.startswith("__grp__")]
    if not groups:  # a module Triton built with the host compiler (a kernel's launcher): one file
        return files if len(files) == 1 else None
    for name in groups:
        try:
            children = json.loads(files[name])["child_paths"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(children, dict):
            return None
        reduced = {}
        for child, path in children.items():
            base = os.path.basename(str(path))
            if not isinstance(child, str) or base not in files:
                return None
            reduced[child] = base
        files[name] = json.dumps({"child_paths": reduced}).encode()
    return files
