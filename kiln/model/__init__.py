"""The Llama-style model, the floor every area stands on: config with presets, the Transformer (no
parallelism inside) and its one forward (training, context parallelism and KV-cached decoding),
MoE, LoRA, the KV cache and meta-device construction. Weight formats are `kiln.model.formats`."""

from kiln.model.attention import AttentionCore, backend_available, sliding_window_mask
from kiln.model.config import ModelConfig
from kiln.model.kv_cache import KVCache
from kiln.model.presets import PRESETS
from kiln.model.rope_scaling import RopeScaling
from kiln.model.transformer import Attention, FeedForward, Transformer, TransformerBlock

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
