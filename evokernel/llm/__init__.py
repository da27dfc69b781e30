"""The LLM client layer: config, chat client with retries, record/replay, token budget."""

from evokernel.llm.budget import TokenBudget, Usage
from evokernel.llm.client import ChatClient, ChatReply, ToolCall
from evokernel.llm.config import HOW_TO_CONFIGURE, LLMConfig, Price, endpoint_problem
from evokernel.llm.errors import BudgetSpent, EndpointError, LLMError, MalformedReply, NotRecorded

__all__ = [
    "HOW_TO_CONFIGURE", "BudgetSpent", "ChatClient", "ChatReply", "EndpointError", "LLMConfig",
    "LLMError", "MalformedReply", "NotRecorded", "Price", "TokenBudget", "ToolCall", "Usage",
    "endpoint_problem",
]
