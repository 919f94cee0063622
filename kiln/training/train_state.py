"""The loop's own progress: optimizer steps taken, tokens seen, and this rank's RNG states.

Like the model, optimizers, schedulers and data loader it speaks `state_dict()` /
`load_state_dict()`, so the checkpointer saves it without knowing the trainer. RNG states are
per rank and only mean something in the same layout, so they travel separately.
"""

from __future__ import annotations

import pickle
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class TrainState:
    step: int = 0
    tokens_seen: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": int(self.step), "tokens_seen": int(self.tokens_seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])

    @staticmethod
    def rng_state_dict() -> bytes:
        """This rank's Python, NumPy, torch (and CUDA) generator states, pickled."""
        state = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        return pickle.dumps(state)

    @staticmethod
    def load_rng_state_dict(blob: bytes) -> None:
        state = pickle.loads(blob)
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if state["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
