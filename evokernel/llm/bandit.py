"""UCB1 over models: with several models, ask more often the one whose replies become children.

Deterministic given its history (no sampling), so a replayed run picks the same
model for the same request and finds it in the recording.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any


class UCB1:
    def __init__(self, arms: Sequence[str], c: float = math.sqrt(2)) -> None:
        if not arms:
            raise ValueError("a bandit needs at least one arm")
        self.arms = list(arms)
        self.c = c
        self.counts = dict.fromkeys(self.arms, 0)
        self.rewards = dict.fromkeys(self.arms, 0.0)
        self._lock = threading.Lock()

    def choose(self) -> str:
        with self._lock:
            for arm in self.arms:
                if self.counts[arm] == 0:
                    return arm
            total = sum(self.counts.values())
            return max(
                self.arms,
                key=lambda a: self.rewards[a] / self.counts[a]
                + self.c * math.sqrt(math.log(total) / self.counts[a]),
            )

    def update(self, arm: str, reward: float) -> None:
        with self._lock:
            if arm in self.counts:
                self.counts[arm] += 1
                self.rewards[arm] += reward

    def state(self) -> dict[str, Any]:
        return {"arms": self.arms, "counts": dict(self.counts), "rewards": dict(self.rewards)}

    def load(self, state: dict[str, Any]) -> None:
        with self._lock:
            for arm in self.arms:
                self.counts[arm] = int(state.get("counts", {}).get(arm, 0))
                self.rewards[arm] = float(state.get("rewards", {}).get(arm, 0.0))
