"""Shared fixtures and the marker rules: ``gpu`` tests skip without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# ../shared beside the checkout; for a git worktree under a folder of worktrees
# (/work/wt/<name>), the one beside that folder.
SHARED = next(
    (p / "shared" for p in (REPO.parent, REPO.parent.parent) if (p / "shared").is_dir()),
    REPO.parent / "shared",
)

# Ray (2.5x+) turns token authentication on for each new local cluster unless
# RAY_AUTH_MODE says otherwise, and caches that choice inside the process. One
# pytest process starts several local clusters (compare, the runtime tests); if the
# mode changed between them, the driver would reject the new GCS's unsigned
# requests and every actor would be cancelled before it ran. So the whole test
# process, and every subprocess it starts, uses one mode, set before Ray loads.
os.environ["RAY_AUTH_MODE"] = "disabled"


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent: the cross-check against published files is skipped")
    return SHARED
