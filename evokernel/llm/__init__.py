"""The LLM client layer: config, chat client with retries, record/replay, token budget.

The names below are imported on first use, so that reading a run config (which holds an
``LLMConfig``) does not import the OpenAI client library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evokernel.llm.budget import TokenBudget, Usage
    from evokernel.llm.client import ChatClient, ChatReply, ToolCall
    from evokernel.llm.config import HOW_TO_CONFIGURE, LLMConfig, Price, endpoint_problem
    from evokernel.llm.errors import (
        BudgetSpent,
        EndpointError,
        LLMError,
        MalformedReply,
        NotRecorded,
    )

_WHERE = {
    "TokenBudget": "budget", "Usage": "budget", "ChatClient": "client", "ChatReply": "client",
    "ToolCall": "client", "HOW_TO_CONFIGURE": "config", "LLMConfig": "config", "Price": "config",
    "endpoint_problem": "config", "BudgetSpent": "errors", "EndpointError": "errors", "LLMError": "errors",
    "MalformedReply": "errors", "NotRecorded": "errors",
}

__all__ = [
    "HOW_TO_CONFIGURE", "BudgetSpent", "ChatClient", "ChatReply", "EndpointError", "LLMConfig",
    "LLMError", "MalformedReply", "NotRecorded", "Price", "TokenBudget", "ToolCall", "Usage",
    "endpoint_problem",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
