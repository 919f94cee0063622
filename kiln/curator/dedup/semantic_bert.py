"""A BERT encoder forward (as in sentence-transformers' MiniLM models) over safetensors weights.

Semantic dedup needs only the encoder's last hidden states; loading them through `transformers`
costs tens of seconds of imports on a busy 2-core machine, this costs one safetensors read. The
result equals `transformers.BertModel` (tested to 1e-5 where transformers is installed).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F


class BertEncoder:
    def __init__(self, folder: str | Path, device: str = "cpu"):
        from safetensors.torch import load_file

        folder = Path(folder)
        cfg = json.loads((folder / "config.json").read_text())
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{folder}: expected a BERT model with gelu (got {cfg})")
        w = load_file(str(folder / "model.safetensors"), device=device)
        self.w = {k.removeprefix("bert."): v for k, v in w.items()}
        self.heads, self.layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
        self.eps, self.hidden_size = cfg.get("layer_norm_eps", 1e-12), cfg["hidden_size"]

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(
            x, (x.shape[-1],), self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps
        )

    def _dense(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states [batch, tokens, hidden] (token type 0, absolute positions)."""
        b, t = ids.shape
        e = "embeddings"
        x = (
            self.w[f"{e}.word_embeddings.weight"][ids]
            + self.w[f"{e}.position_embeddings.weight"][:t]
            + self.w[f"{e}.token_type_embeddings.weight"][0]
        )
        x = self._ln(x, f"{e}.LayerNorm")
        bias = torch.zeros(b, 1, 1, t, dtype=x.dtype, device=x.device)
        bias = bias.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(x.dtype).min)
        for i in range(self.layers):
            p = f"encoder.layer.{i}"

            def heads(y: torch.Tensor) -> torch.Tensor:
                return y.view(b, t, self.heads, -1).transpose(1, 2)

            q, k, v = (
                heads(self._dense(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value")
            )
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            a = self._dense(a.transpose(1, 2).reshape(b, t, -1), f"{p}.attention.output.dense")
            x = self._ln(x + a, f"{p}.attention.output.LayerNorm")
            h = F.gelu(self._dense(x, f"{p}.intermediate.dense"))
            x = self._ln(x + self._dense(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        return x
