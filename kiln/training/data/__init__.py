"""Tokens: tokenizer training, Megatron indexed datasets, the GPT dataset and the training loader.

`build_dataloader` is what the trainer calls.
"""

from kiln.training.data.config import DataConfig
from kiln.training.data.loader import build_dataloader

__all__ = ["DataConfig", "build_dataloader"]
