"""The Llama-style model: config with presets, the Transformer (no parallelism inside) and its one
forward (training, context parallelism and KV-cached generation), and its weight I/O (weights.py:
kiln checkpoints, Hugging Face folders via hf_names.py, GGUF files via gguf.py)."""

from kiln.training.model.attention import AttentionCore, backend_available, sliding_window_mask
from kiln.training.model.config import PRESETS, ModelConfig, RopeScaling
from kiln.training.model.kv_cache import KVCache
from kiln.training.model.transformer import Attention, FeedForward, Transformer, TransformerBlock

__all__ = [
    "PRESETS",
    "Attention",
    "AttentionCore",
    "FeedForward",
    "KVCache",
    "ModelConfig",
    "RopeScaling",
    "Transformer",
    "TransformerBlock",
    "backend_available",
    "sliding_window_mask",
]
