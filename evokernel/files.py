"""Files that survive a kill -9: atomic writes, fsynced directories, and a directory lock.

A file written with :func:`atomic_write` goes to a temporary name, is fsynced, then
renamed over the old one, so a reader sees the old version or the whole new one.
:class:`DirectoryLock` holds a directory for one process: an ``flock`` on the directory
itself, which the kernel releases when the process ends however it ends, plus a small
``lock.json`` naming the holder for the message a second process gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, sort_keys=True, indent=1) + "\n")


def fsync_dir(path: Path) -> None:
    """Make the entries of ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LockHeld(Exception):
    """Another process holds the directory; the message names it."""


class DirectoryLock:
    """An exclusive, non-blocking lock on one directory for this process."""

    HOLDER = "lock.json"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (no-op if this object holds it); ``LockHeld`` if another does."""
        if self._fd is not None:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LockHeld(self.holder()) from None
        self._fd = fd
        atomic_write_json(self.directory / self.HOLDER, {
            "pid": os.getpid(), "host": socket.gethostname(), "since": now(), "command": " ".join(sys.argv)[:300],
        })

    def holder(self) -> str:
        """Who holds the lock, as ``lock.json`` says (``another process`` if it cannot)."""
        try:
            data = json.loads((self.directory / self.HOLDER).read_text())
            return f"process {data['pid']} on {data['host']} (since {data['since']}: {data['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            (self.directory / self.HOLDER).unlink()
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None

    def moved(self, directory: Path) -> None:
        """The locked directory was renamed to ``directory`` (the lock follows the inode)."""
        self.directory = directory
