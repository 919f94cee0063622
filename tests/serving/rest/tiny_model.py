"""A tiny random kiln model with a tokenizer trained on the spot, exported as A's export does."""

from __future__ import annotations

import os

from tests.engine.tiny import train_tokenizer


def make_tiny_model(out_dir: str, *, seed: int = 0, max_seq_len: int = 512, **overrides) -> str:
    """Write an exported Hugging Face dir for a random tiny Llama; returns its path."""
    import torch

    from kiln.engine.generator import Generator
    from kiln.model.config import ModelConfig
    from kiln.model.transformer import Transformer
    from kiln.serving.export.hf import export_hf

    tok = train_tokenizer()
    cfg = ModelConfig.preset(
        "tiny", vocab_size=tok.get_vocab_size(), n_layers=2, max_seq_len=max_seq_len, **overrides
    )
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    gen = Generator(model, tok, model_name="tiny")
    os.makedirs(out_dir, exist_ok=True)
    export_hf(gen, out_dir)
    return out_dir
