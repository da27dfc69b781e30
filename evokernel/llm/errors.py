"""Why an LLM request produced no reply. Operators turn these into recorded outcomes."""

from __future__ import annotations


class LLMError(Exception):
    """A request that got no usable reply; ``reason`` is a short stable code to count."""

    reason = "llm_error"


class BudgetSpent(LLMError):
    """The run's token budget is spent: no further request is sent."""

    reason = "budget_spent"


class NotRecorded(LLMError):
    """Replay mode met a request that the recording does not hold."""

    reason = "not_recorded"


class EndpointError(LLMError):
    """The endpoint failed (after retries where the failure was transient)."""

    reason = "endpoint_error"


class MalformedReply(LLMError):
    """The endpoint answered with something that is not a chat completion."""

    reason = "malformed_reply"
