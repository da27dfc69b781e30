"""Triton's cache in a candidate's process: the judge's store first, then its own.

Triton asks its cache manager (``TRITON_CACHE_MANAGER``, this class in every candidate
process: ``triton_store.TritonStore.environment``) for a kernel's files before it compiles
one. This one looks in the store of compiled seed kernels the judge binds read-only into
the process (``EVOKERNEL_TRITON_KERNELS``), then in the process's private cache, where
whatever it compiles goes, as with Triton's own ``FileCacheManager``.

The store's groups name their files by name alone (the judge reduced them as it copied
them): they are found beside the group, wherever the store is bound.
"""

from __future__ import annotations

import json
import os

from triton.runtime.cache import FileCacheManager

from evokernel.evaluate.isolation import TRITON_KERNELS_VARIABLE

__all__ = ["StoreFirstCacheManager"]


# triton has no type information: its base class is Any to mypy
class StoreFirstCacheManager(FileCacheManager):  # type: ignore[misc]
    """Triton's file cache, behind the judge's read-only store of seed kernels."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        store = os.environ.get(TRITON_KERNELS_VARIABLE, "")
        self.stored = os.path.join(store, key) if store and not (override or dump) else None
        """The store's folder for this key (None: no store, or a dump or override)."""

    def get_file(self, filename: str) -> str | None:
        if self.stored is not None:
            path = os.path.join(self.stored, filename)
            if os.path.isfile(path):
                return path
        found: str | None = super().get_file(filename)
        return found

    def get_group(self, filename: str) -> dict[str, str] | None:
        if self.stored is not None:
            group = _stored_group(self.stored, filename)
            if group is not None:
                return group
        found: dict[str, str] | None = super().get_group(filename)
        return found


def _stored_group(folder: str, filename: str) -> dict[str, str] | None:
    """The group ``filename`` of the store's ``folder``, its files found beside it; None
    where it is missing or names a file that is not there."""
    try:
        with open(os.path.join(folder, f"__grp__{filename}")) as f:
            children = json.load(f)["child_paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(children, dict):
        return None
    group = {}
    for child, name in children.items():
        path = os.path.join(folder, os.path.basename(str(name)))
        if not os.path.isfile(path):
            return None
        group[str(child)] = path
    return group
