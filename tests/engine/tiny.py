"""Tiny models and a tokenizer trained on the spot, for serving tests (no downloads)."""

from __future__ import annotations

import torch

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "kiln turns raw text into a served language model",
    "hello world, this is a tiny tokenizer for tests",
    "triton and ray serve answer requests over http and grpc",
]

# Llama-, Mistral- (sliding window smaller than the prompts) and Mixtral-shaped
SHAPES = {
    "llama": {"tie_embeddings": True},
    "mistral": {"sliding_window": 5},
    "mixtral": {"n_experts": 4, "top_k": 2},
}


def train_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (like the tokens stage makes) with an end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    return tok


def tiny_config(shape: str, vocab_size: int, **overrides):
    from kiln.model import ModelConfig

    fields = {
        "vocab_size": vocab_size,
        "dim": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "ffn_hidden_dim": 64,
        "max_seq_len": 96,
    }
    return ModelConfig(**{**fields, **SHAPES[shape], **overrides})


def tiny_model(shape: str, vocab_size: int, seed: int = 0, **overrides):
    """A random model with peaked logits (std 0.3 weights), so greedy never hangs on near-ties."""
    from kiln.model import Transformer

    torch.manual_seed(seed)
    model = Transformer(tiny_config(shape, vocab_size, **overrides))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


def tiny_generator(shape: str, tokenizer, eos: bool = True, **overrides):
    from kiln.engine.generator import Generator

    model = tiny_model(shape, tokenizer.get_vocab_size(), **overrides)
    return Generator(
        model, tokenizer, model_name=f"tiny-{shape}", eos_token_ids=None if eos else []
    )
