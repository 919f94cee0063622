"""The reward callable type and the exception a reward raises to give its reason."""

from __future__ import annotations

from collections.abc import Callable

Reward = Callable[[str, str, dict], float]


class RewardFailed(Exception):
    """Raised by a reward that can say why a completion failed; `score` is kept (partial credit)."""

    def __init__(self, reason: str, score: float = 0.0) -> None:
        super().__init__(reason)
        self.score = score
