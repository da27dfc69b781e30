"""Token accounting: per-call usage, a run-level token budget, a cost estimate.

The budget charges each distinct request once (by its recording key), so a
resumed run that is answered from its recording is not charged twice, and a
replayed run stops exactly where the recorded one did.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from evokernel.llm.config import Price


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


def cost_usd(model: str, usage: Usage, prices: Mapping[str, Price]) -> float:
    price = prices.get(model)
    if price is None:
        return 0.0
    return (
        usage.prompt_tokens * price.input_per_mtok + usage.completion_tokens * price.output_per_mtok
    ) / 1e6


class TokenBudget:
    """Thread-safe tally of tokens and cost against an optional limit."""

    def __init__(self, limit: int | None = None, prices: Mapping[str, Price] | None = None) -> None:
        self.limit = limit
        self.prices = dict(prices or {})
        self.usage = Usage()
        self.cost_usd = 0.0
        self.calls = 0
        self._charged: set[str] = set()
        self._lock = threading.Lock()

    @property
    def spent(self) -> bool:
        return self.limit is not None and self.usage.total >= self.limit

    @property
    def left(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.usage.total)

    def charge(self, key: str, model: str, usage: Usage) -> bool:
        """Count one answered request; False (and nothing counted) if already counted."""
        with self._lock:
            if key in self._charged:
                return False
            self._charged.add(key)
            self.usage = self.usage + usage
            self.cost_usd += cost_usd(model, usage, self.prices)
            self.calls += 1
            return True

    def summary(self) -> dict[str, float | int | None]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "total_tokens": self.usage.total,
            "token_budget": self.limit,
            "cost_usd": round(self.cost_usd, 6),
        }
