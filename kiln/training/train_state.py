"""The loop's own progress: optimizer steps taken and tokens seen.

Like the model, optimizers, schedulers and data loader it speaks `state_dict()` /
`load_state_dict()`, so the checkpointer saves it without knowing the trainer. RNG states are
per rank and only mean something in the same layout, so they travel separately, as JSON
(`kiln.training.checkpoint.json_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TrainState:
    step: int = 0
    tokens_seen: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": int(self.step), "tokens_seen": int(self.tokens_seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
