"""A distillation teacher: any model Kiln reads (checkpoint, HF folder, export), frozen, checked
to speak the student's tokenizer (the divergences compare logits token id by token id)."""

from __future__ import annotations

import os

from torch import nn

from kiln.model.formats.weights import build_model, read_weights
from kiln.platform.errors import ConfigError, InputError
from kiln.text.tokenizer import find_tokenizer


def load_teacher(
    field: str, path: str, vocab_size: int, student_tokenizer=None, device="cpu"
) -> nn.Module:
    """The teacher at `path`, frozen, in eval mode. ConfigError naming `field` when its
    vocabulary size or (where both have one) its tokenizer differs from the student's."""
    where, cfg, state = read_weights(path)
    if cfg.vocab_size != vocab_size:
        raise ConfigError(
            f"{field}: {path}: the teacher's vocabulary has {cfg.vocab_size} tokens, the "
            f"student's {vocab_size}; distillation needs the same tokenizer"
        )
    if student_tokenizer is not None:
        try:
            teacher_tok, _ = find_tokenizer(None, [where, os.path.dirname(where.rstrip("/"))])
        except InputError:  # no tokenizer files beside the weights: the vocab size must do
            teacher_tok = None
        if teacher_tok is not None and teacher_tok.get_vocab() != student_tokenizer.get_vocab():
            raise ConfigError(
                f"{field}: {path}: the teacher's tokenizer differs from the student's (same size, "
                "different tokens); distillation needs the same tokenizer"
            )
    return build_model(cfg, state, device=device).requires_grad_(False)
