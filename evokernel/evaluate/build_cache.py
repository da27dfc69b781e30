"""A content-addressed store of compiled kernels, shared by the processes of one evaluator.

A CUDA candidate's binary depends only on its source (parameters included, as
``#define`` lines), the target architecture and the compiler, so it is stored
under a hash of exactly those. Two things use it: the build-ahead processes, which
compile the next candidates while the GPU times the current one, and re-evaluations
of the same variant (another evaluator seed, a resumed run), which skip the compiler.

A cached binary is only ever a build: every evaluation still checks what it computes,
so a stale or tampered entry can cost a wrong status, never a wrong fitness.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def build_key(*parts: str) -> str:
    """The cache key of a build: a hash over everything the binary depends on."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part.encode())
    return digest.hexdigest()[:32]


class BuildCache:
    """``<root>/<key>.bin`` holds the binary, ``<key>.json`` what the compiler reported."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def load(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        try:
            meta = json.loads((self.root / f"{key}.json").read_text())
            binary = (self.root / f"{key}.bin").read_bytes()
        except (OSError, json.JSONDecodeError):
            return None
        if not isinstance(meta, dict) or meta.get("size") != len(binary):
            return None  # torn or foreign entry: build again
        return binary, meta

    def store(self, key: str, binary: bytes, meta: dict[str, Any] | None = None) -> None:
        """Write atomically: the binary first, then the metadata that vouches for it."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._write(self.root / f"{key}.bin", binary)
        self._write(self.root / f"{key}.json", json.dumps({**(meta or {}), "size": len(binary)}).encode())

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
