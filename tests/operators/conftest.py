"""Fixtures for the LLM operator tests: a scripted loopback server, a client, dsa_topk seeds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evokernel.candidate import Candidate
from evokernel.llm import ChatClient, LLMConfig
from evokernel.llm.stub import StubLLMServer
from evokernel.operators import OperatorContext
from evokernel.workload import load_workload


@pytest.fixture
def stub() -> Iterator[StubLLMServer]:
    with StubLLMServer() as server:
        yield server


@pytest.fixture
def make_client(stub: StubLLMServer, tmp_path: Path) -> Callable[..., ChatClient]:
    def make(run_dir: Path | None = tmp_path, **over: Any) -> ChatClient:
        fields: dict[str, Any] = {
            "base_url": stub.base_url, "model": "stub-model", "timeout_s": 2.0,
            "max_retries": 1, "backoff_s": 0.0, **over,
        }
        return ChatClient(LLMConfig(**fields), run_dir, environ={}, sleep=lambda s: None)

    return make


@pytest.fixture(scope="session")
def seeds() -> dict[str, Candidate]:
    return {c.name: c for c in load_workload("dsa_topk").seeds()}


@pytest.fixture
def ctx() -> Callable[..., OperatorContext]:
    def make(seed: int = 0, **kw: Any) -> OperatorContext:
        return OperatorContext(rng=np.random.default_rng(seed), workload="dsa_topk", budget_left=10, **kw)

    return make
