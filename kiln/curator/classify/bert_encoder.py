"""The learned classifier's sentence encoder for BERT models (MiniLM by default), built for
scoring a corpus on CPU.

The same function as semantic dedup's `Embedder` (mean-pooled, unit-length last hidden states of
each document's first `max_tokens` tokens), with what a corpus pass needs:

- only a document's head is tokenised: the first `max_tokens` tokens of a ~10k-character page
  lie in its first few thousand characters, and tokenising the whole page was most of the time
  on short windows. The text is cut at a whitespace (where BERT's pre-tokenizer splits anyway,
  so the tokens are those of the whole text) and tokenised whole only when the cut is too short;
- documents are batched by length (sorted, padded to their batch's longest), so short documents
  do not pay for a long one's padding; results come back in input order;
- the linear layers run in bf16 on the CPU's matrix units (AMX, AVX-512-BF16) with weights
  packed once (`kiln.model.cpu_linear`), q/k/v as one matrix; attention is torch's SDPA. Other
  CPUs, and `precision: fp32`, run the float32 model.

Batches depend only on the texts given, so a file gives the same vectors in this process and in
a Ray Data actor.
"""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from kiln.curator.dedup.semantic import resolve_model
from kiln.model.cpu_linear import PackedBf16Weight, cpu_has_bf16_matmul
from kiln.text.tokenizer import load_tokenizer

# Characters tokenised first per token wanted: English prose is ~4.5 characters a BERT token,
# Japanese ~1; a head too short for `max_tokens` tokens is tokenised again in full.
CHARS_PER_TOKEN = 6


class Linear:
    """y = x W^T + b, in float32 or with a packed bf16 weight (bf16 in and out)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, bf16: bool):
        self.bf16 = bf16
        self.packed = PackedBf16Weight(weight) if bf16 else None
        self.weight = None if bf16 else weight.float()
        self.bias = bias.to(torch.bfloat16 if bf16 else torch.float32)

    def __call__(self, x: torch.Tensor, gelu: bool = False) -> torch.Tensor:
        """x W^T + b, then GELU (erf) when `gelu`: in bf16 as oneDNN's fused post-op."""
        if self.packed is None:
            y = F.linear(x, self.weight, self.bias)
            return F.gelu(y) if gelu else y
        a = x.reshape(-1, x.shape[-1]).contiguous()
        op = "gelu" if gelu else "none"
        y = torch.ops.mkldnn._linear_pointwise(a, self.packed.packed, self.bias, op, [], "none")
        return y.view(*x.shape[:-1], -1)


def use_bf16(precision: str) -> bool:
    """bf16 where it pays: `auto` when the CPU has bf16 matrix units (never on emulation)."""
    return precision == "bf16" or (precision == "auto" and cpu_has_bf16_matmul())


class BertSentenceEncoder:
    """texts -> [n, hidden] float32 unit vectors (mean over real tokens of the last layer)."""

    def __init__(self, model: str, max_tokens: int, batch_size: int, precision: str = "auto"):
        folder = resolve_model(model)
        cfg = json.loads((folder / "config.json").read_text())
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{folder}: expected a BERT model with gelu (got {cfg})")
        self.tok = load_tokenizer(folder / "tokenizer.json")
        self.tok.no_padding()
        self.tok.enable_truncation(max_tokens)
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.pad_id = self.tok.token_to_id("[PAD]") or 0
        self.bf16 = use_bf16(precision)
        self.dtype = torch.bfloat16 if self.bf16 else torch.float32
        self.heads, self.eps = cfg["num_attention_heads"], cfg.get("layer_norm_eps", 1e-12)
        self.hidden_size = cfg["hidden_size"]
        w = {k.removeprefix("bert."): v for k, v in load_file(folder / "model.safetensors").items()}
        e = "embeddings"
        self.word = w[f"{e}.word_embeddings.weight"].to(self.dtype)
        # absolute positions plus token type 0, added once
        self.position = (
            w[f"{e}.position_embeddings.weight"] + w[f"{e}.token_type_embeddings.weight"][0]
        ).to(self.dtype)
        self.embed_norm = self._norm(w, f"{e}.LayerNorm")
        self.layers = [
            self._layer(w, f"encoder.layer.{i}") for i in range(cfg["num_hidden_layers"])
        ]

    def _norm(self, w: dict, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return w[f"{name}.weight"].to(self.dtype), w[f"{name}.bias"].to(self.dtype)

    def _layer(self, w: dict, p: str) -> dict:
        a = f"{p}.attention.self"
        qkv = [f"{a}.{n}" for n in ("query", "key", "value")]
        return {
            "qkv": Linear(
                torch.cat([w[f"{n}.weight"] for n in qkv]),
                torch.cat([w[f"{n}.bias"] for n in qkv]),
                self.bf16,
            ),
            "out": self._linear(w, f"{p}.attention.output.dense"),
            "norm1": self._norm(w, f"{p}.attention.output.LayerNorm"),
            "up": self._linear(w, f"{p}.intermediate.dense"),
            "down": self._linear(w, f"{p}.output.dense"),
            "norm2": self._norm(w, f"{p}.output.LayerNorm"),
        }

    def _linear(self, w: dict, name: str) -> Linear:
        return Linear(w[f"{name}.weight"], w[f"{name}.bias"], self.bf16)

    def _ln(self, x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], self.eps)

    def ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's first `max_tokens` token ids ([CLS] ... [SEP]), from its head when the
        head holds them (see the module docstring)."""
        cut = self.max_tokens * CHARS_PER_TOKEN
        heads = [t if len(t) <= cut else t[: t.rfind(" ", 0, cut) + 1 or len(t)] for t in texts]
        out = [e.ids for e in self.tok.encode_batch(heads)]
        short = [
            i
            for i, (t, h, x) in enumerate(zip(texts, heads, out, strict=True))
            if len(h) < len(t) and len(x) < self.max_tokens
        ]
        for i, e in zip(short, self.tok.encode_batch([texts[i] for i in short]), strict=True):
            out[i] = e.ids
        return out

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states [batch, tokens, hidden] in the working dtype."""
        b, t = ids.shape
        x = self._ln(self.word[ids] + self.position[:t], self.embed_norm)
        bias = torch.zeros(b, 1, 1, t, dtype=x.dtype)
        bias.masked_fill_(~mask[:, None, None, :], float("-inf"))
        for layer in self.layers:
            q, k, v = layer["qkv"](x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            x = self._ln(x + layer["out"](a.transpose(1, 2).reshape(b, t, -1)), layer["norm1"])
            x = self._ln(x + layer["down"](layer["up"](x, gelu=True)), layer["norm2"])
        return x

    def __call__(self, texts: list[str]) -> np.ndarray:
        ids = self.ids(texts)
        out = np.zeros((len(texts), self.hidden_size), np.float32)
        order = sorted(range(len(texts)), key=lambda i: (len(ids[i]), i))
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                rows = order[s : s + self.batch_size]
                width = len(ids[rows[-1]])
                batch = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros(len(rows), width, dtype=torch.bool)
                for j, i in enumerate(rows):
                    batch[j, : len(ids[i])] = torch.tensor(ids[i])
                    mask[j, : len(ids[i])] = True
                hidden = self.forward(batch, mask).float()
                m = mask.unsqueeze(-1).float()
                pooled = (hidden * m).sum(1) / m.sum(1)
                out[rows] = F.normalize(pooled, dim=-1).numpy()
        return out
