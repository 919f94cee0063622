"""A Llama-style decoder, read top to bottom. No parallelism lives here (see kiln/training/parallel)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kiln.platform.errors import ConfigError
from kiln.training.model.attention import AttentionCore
from kiln.training.model.config import ModelConfig
from kiln.training.model.norms import RMSNorm
from kiln.training.model.rope import apply_rope, rope_tables


class Attention(nn.Module):
    """Multi-head attention with GQA/MQA (n_kv_heads <= n_heads), RoPE and an exchangeable core."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.core = AttentionCore(cfg.head_dim, cfg.sliding_window, cfg.attention_backend)

    def forward(
        self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor
    ) -> torch.Tensor:
        B, S, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos[:S], rope_sin[:S]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _build_moe(cfg: ModelConfig) -> nn.Module:
    try:
        from kiln.training.model.moe import MoE
    except ImportError as exc:  # B's module; the dense model never needs it
        raise ConfigError(
            f"model.n_experts={cfg.n_experts} needs kiln.training.model.moe ({exc})"
        ) from exc
    return MoE(cfg.dim, cfg.ffn_hidden_dim, cfg.n_experts, cfg.top_k, cfg.capacity_factor)


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention then feed-forward (dense) or mixture of experts."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if cfg.n_experts > 0:
            self.moe = _build_moe(cfg)
        else:
            self.feed_forward = FeedForward(cfg.dim, cfg.ffn_hidden_dim)

    def forward(
        self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope_cos, rope_sin)
        mlp = self.moe if hasattr(self, "moe") else self.feed_forward
        return h + mlp(self.ffn_norm(h))


class Transformer(nn.Module):
    """tokens [B, S] -> logits [B, S, V]. As a pipeline stage, parts set to None are skipped."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        # A ModuleDict keyed by the global index keeps names like `layers.7` in every pipeline stage.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Non-persistent: recomputed, never checkpointed; context parallelism swaps in local rows.
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Llama/GPT-2 init (std 0.02, residual projections scaled by depth); rebuilds RoPE tables.

        Call after `to_empty()` when the model was built on the meta device.
        """
        cos, sin = rope_tables(
            self.cfg.head_dim,
            self.cfg.max_seq_len,
            self.cfg.rope_theta,
            device=buffer_device or self.rope_cos.device,
        )
        self.rope_cos, self.rope_sin = cos, sin
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                is_residual = name.endswith(("wo", "w2"))
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if is_residual else 0.02)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h
