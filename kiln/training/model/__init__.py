"""The Llama-style model: config with presets, the Transformer (no parallelism inside) and its one
forward (training, context parallelism and KV-cached generation), and its weight I/O (weights.py:
kiln checkpoints, Hugging Face folders via hf_names.py, GGUF files via gguf.py)."""

from kiln.training.model.config import PRESETS, ModelConfig, RopeScaling

# The nn modules import torch (~1-2 s): loaded on first use, so reading a config (every `kiln run`
# of a spec with a training stage, and the checks before a launch) does not pay for it.
_MODULES = {
    "AttentionCore": "attention",
    "backend_available": "attention",
    "sliding_window_mask": "attention",
    "KVCache": "kv_cache",
    "Attention": "transformer",
    "FeedForward": "transformer",
    "Transformer": "transformer",
    "TransformerBlock": "transformer",
}


def __getattr__(name: str):
    if name in _MODULES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
