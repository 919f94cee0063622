"""The Llama-style model: config with presets, and the Transformer (no parallelism inside)."""

from kiln.training.model.attention import AttentionCore, backend_available, sliding_window_mask
from kiln.training.model.config import PRESETS, ModelConfig
from kiln.training.model.transformer import Attention, FeedForward, Transformer, TransformerBlock

__all__ = [
    "PRESETS",
    "Attention",
    "AttentionCore",
    "FeedForward",
    "ModelConfig",
    "Transformer",
    "TransformerBlock",
    "backend_available",
    "sliding_window_mask",
]
