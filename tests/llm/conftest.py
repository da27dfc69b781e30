"""A scripted OpenAI-compatible server on a loopback port, and clients pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from evokernel.llm import ChatClient, LLMConfig
from evokernel.llm.stub import StubLLMServer


@pytest.fixture
def stub() -> Iterator[StubLLMServer]:
    with StubLLMServer() as server:
        yield server


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make_client(stub: StubLLMServer, tmp_path: Path, sleeps: list[float]) -> Callable[..., ChatClient]:
    """``make_client(**config overrides)``: record mode into tmp_path/llm, no real sleeping."""

    def make(run_dir: Path | None = tmp_path, environ: dict[str, str] | None = None, **over: Any) -> ChatClient:
        fields: dict[str, Any] = {
            "base_url": stub.base_url, "model": "stub-model", "timeout_s": 2.0,
            "max_retries": 2, "backoff_s": 0.5, "backoff_max_s": 4.0, **over,
        }
        return ChatClient(LLMConfig(**fields), run_dir, environ=environ or {}, sleep=sleeps.append)

    return make
