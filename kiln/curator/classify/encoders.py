"""Sentence encoders for the learned classifier: texts -> unit-length float32 vectors.

`minilm` (or a sentence-transformers BERT folder) is the model semantic dedup ships, run by
`bert_encoder` (bf16 on CPUs with matrix units, length-sorted batches); any other
source is a Kiln-loadable language model (checkpoint, HF folder, .gguf file or a package shipping
one) whose last hidden states (after the final norm) are mean-pooled over the real tokens.
Documents are embedded in fixed batches in input order, so a file gives the same vectors in this
process and in a Ray Data actor.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

import numpy as np
import torch

from kiln.curator.classify.bert_encoder import BertSentenceEncoder
from kiln.curator.classify.config import EmbeddingConfig
from kiln.curator.dedup.semantic import DEFAULT_MODEL
from kiln.model.formats.checkpoint_tokenizer import tokenizer_folder
from kiln.model.formats.weights import build_model, read_model, read_weights
from kiln.text.tokenizer import find_tokenizer

Encoder = Callable[[list[str]], np.ndarray]


def _is_bert_folder(path: str) -> bool:
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return False
    with open(config) as f:
        return json.load(f).get("model_type") == "bert"


class LanguageModelEncoder:
    """Mean-pooled final hidden states of a Kiln model (its LM head dropped), right-padded."""

    def __init__(self, source: str, tokenizer: str | None, max_tokens: int, batch_size: int):
        if os.path.isdir(source):
            _, cfg, state = read_weights(source)
            root = os.path.dirname(os.path.normpath(source))  # a step folder's checkpoint root
            search = [tokenizer_folder(source), root]
        else:  # a .gguf file or a package: its tokenizer is written out beside
            search = [tempfile.mkdtemp(prefix="kiln-classify-")]
            cfg, state = read_model(source, search[0])
        self.tok, _ = find_tokenizer(tokenizer, search)
        self.model = build_model(cfg, state, device="cpu").eval()
        self.model.output = None  # a part set to None is skipped: forward returns hidden states
        self.max_tokens = min(max_tokens, cfg.max_seq_len)
        self.batch_size = batch_size
        self.dim = cfg.dim

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                ids = [
                    e.ids[: self.max_tokens] or [0]
                    for e in self.tok.encode_batch(texts[i : i + self.batch_size])
                ]
                width = max(len(x) for x in ids)
                tokens = torch.tensor([x + [0] * (width - len(x)) for x in ids])
                mask = torch.tensor([[1.0] * len(x) + [0.0] * (width - len(x)) for x in ids])
                hidden = self.model(tokens).float()  # causal: real tokens never see the padding
                pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)


def load_encoder(cfg: EmbeddingConfig) -> Encoder:
    """The encoder named by `embedding.encoder` (see the module docstring)."""
    source = cfg.encoder
    if source == "minilm" or (os.path.isdir(source) and _is_bert_folder(source)):
        model = DEFAULT_MODEL if source == "minilm" else source
        return BertSentenceEncoder(model, cfg.max_tokens, cfg.batch_size, cfg.precision)
    return LanguageModelEncoder(source, cfg.tokenizer, cfg.max_tokens, cfg.batch_size)
