"""Model shape: one typed config, with presets from a test-sized model up to Llama-3-8B."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kiln.platform.errors import ConfigError


class RopeScaling(BaseModel):
    """Llama-3.1 RoPE frequency scaling (HF `rope_scaling` with `rope_type: llama3`)."""

    model_config = ConfigDict(extra="forbid")

    rope_type: Literal["llama3"] = Field("llama3", description="Scaling scheme (only Llama-3's).")
    factor: float = Field(
        8.0, gt=0, description="How much longer than original_max_seq_len the context is stretched."
    )
    low_freq_factor: float = Field(
        1.0, gt=0, description="Wavelengths above original_max_seq_len / this are scaled by factor."
    )
    high_freq_factor: float = Field(
        4.0, gt=0, description="Wavelengths below original_max_seq_len / this are not scaled."
    )
    original_max_seq_len: int = Field(
        8192, gt=0, description="The context length the model was pretrained with."
    )


class ModelConfig(BaseModel):
    """A Llama-style decoder. Field names follow torchtitan; `to_hf` in serving maps them to HF."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(256, gt=0, description="Tokenizer vocabulary size.")
    dim: int = Field(64, gt=0, description="Hidden size.")
    n_layers: int = Field(4, gt=0, description="Transformer blocks.")
    n_heads: int = Field(4, gt=0, description="Attention heads.")
    n_kv_heads: int | None = Field(None, description="GQA/MQA key-value heads (None: = n_heads).")
    head_dim: int | None = Field(
        None, gt=0, description="Width of one head (None: dim / n_heads; Qwen3 sets it wider)."
    )
    ffn_hidden_dim: int = Field(128, gt=0, description="SwiGLU hidden size.")
    norm_eps: float = Field(1e-5, description="RMSNorm epsilon.")
    rope_theta: float = Field(10000.0, description="RoPE base frequency.")
    rope_scaling: RopeScaling | None = Field(
        None, description="Llama-3.1 RoPE scaling for long contexts (None: plain RoPE)."
    )
    max_seq_len: int = Field(256, gt=0, description="Longest sequence (RoPE table size).")
    sliding_window: int | None = Field(
        None, gt=0, description="Each token sees itself and the previous window-1 tokens (Mistral)."
    )
    n_experts: int = Field(0, ge=0, description="0: dense feed-forward; >0: MoE in every layer.")
    top_k: int = Field(2, gt=0, description="Experts each token is routed to (MoE).")
    capacity_factor: float | None = Field(None, gt=0, description="None: no token dropping.")
    moe_aux_loss_coef: float = Field(
        0.01, ge=0, description="Weight of the MoE load-balancing loss."
    )
    tie_embeddings: bool = Field(
        False, description="Share the input embedding and output projection weights."
    )
    qkv_bias: bool = Field(False, description="Biases on the q/k/v projections (Qwen2).")
    qk_norm: bool = Field(
        False, description="RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)."
    )
    norm_unit_offset: bool = Field(
        False, description="RMSNorm scales by (1 + w), w starting at 0, in fp32 (Gemma)."
    )
    sandwich_norm: bool = Field(
        False, description="Also norm the attention and FFN outputs before the residual (Gemma)."
    )
    embed_scale: bool = Field(
        False, description="Scale token embeddings by sqrt(dim), in the model dtype (Gemma)."
    )
    ffn_activation: Literal["silu", "gelu_tanh"] = Field(
        "silu", description="Gated FFN activation: silu (SwiGLU) or gelu_tanh (GeGLU, Gemma)."
    )
    sliding_window_pattern: int | None = Field(
        None,
        gt=0,
        description="With sliding_window: every N-th layer attends globally, the others within "
        "the window (Gemma 3: 6). None: every layer uses the window.",
    )
    rope_local_theta: float | None = Field(
        None, description="RoPE base of the sliding-window layers (None: rope_theta; Gemma 3)."
    )
    query_pre_attn_scalar: float | None = Field(
        None, gt=0, description="Attention scores scale by this**-0.5 (None: head_dim; Gemma 3)."
    )
    attn_logit_softcap: float | None = Field(
        None, gt=0, description="Attention scores pass through cap * tanh(s / cap) (Gemma 2)."
    )
    final_logit_softcap: float | None = Field(
        None, gt=0, description="Output logits pass through cap * tanh(l / cap) (Gemma 2)."
    )
    norm_topk_prob: bool = Field(
        True,
        description="MoE: renormalise the top-k router probabilities to sum to 1 (Mixtral, "
        "Qwen3-MoE); false weighs experts by their softmax probability over all experts.",
    )
    attention_backend: Literal["auto", "sdpa", "flash_attn", "te"] = Field(
        "auto",
        description="auto: flash-attn or Transformer Engine on GPUs that have them, else SDPA.",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None and self.dim % self.n_heads:
            raise ConfigError(
                f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_heads ({self.n_heads}) must be divisible by "
                f"model.n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_heads
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim ({self.head_dim}) must be even for RoPE")
        if self.n_experts and self.top_k > self.n_experts:
            raise ConfigError(
                f"model.top_k ({self.top_k}) must be <= model.n_experts ({self.n_experts})"
            )
        return self

    def is_local_layer(self, layer_id: int) -> bool:
        """Whether this layer attends within `sliding_window` (else over the whole prefix)."""
        if self.sliding_window is None:
            return False
        return self.sliding_window_pattern is None or (layer_id + 1) % self.sliding_window_pattern

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        """A named shape (`tiny`, `125m`, `1b`, `llama3_8b`), optionally with fields overridden."""
        if name not in PRESETS:
            raise ConfigError(
                f"model preset {name!r} is unknown; expected one of {sorted(PRESETS)}"
            )
        return cls(**{**PRESETS[name], **overrides})

    def num_params(self, exclude_embedding: bool = False) -> int:
        """Parameter count computed from the shape (no model needed: FLOP and memory planning)."""
        d, h = self.dim, self.ffn_hidden_dim
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attn = d * q * 2 + d * kv * 2 + ((q + 2 * kv) if self.qkv_bias else 0)
        attn += 2 * self.head_dim if self.qk_norm else 0
        ffn = 3 * d * h * max(1, self.n_experts) + (d * self.n_experts if self.n_experts else 0)
        per_layer = attn + ffn + (4 if self.sandwich_norm else 2) * d
        emb = self.vocab_size * d
        out = 0 if self.tie_embeddings else self.vocab_size * d
        total = self.n_layers * per_layer + d + emb + out
        return total - emb if exclude_embedding else total


PRESETS: dict[str, dict] = {
    # Tests: fast on 2 CPU cores, 4 layers so pp=2 with 2 virtual stages has a layer per stage.
    "tiny": {
        "vocab_size": 256,
        "dim": 64,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "ffn_hidden_dim": 128,
        "max_seq_len": 256,
    },
    # GPT-2-small sized Llama.
    "125m": {
        "vocab_size": 32000,
        "dim": 768,
        "n_layers": 12,
        "n_heads": 12,
        "n_kv_heads": 12,
        "ffn_hidden_dim": 2048,
        "max_seq_len": 2048,
    },
    # Llama-3.2-1B shape.
    "1b": {
        "vocab_size": 128256,
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_hidden_dim": 8192,
        "rope_theta": 500000.0,
        "max_seq_len": 4096,
        "tie_embeddings": True,
    },
    # Llama-3-8B shape (FLOP and memory planning).
    "llama3_8b": {
        "vocab_size": 128256,
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_hidden_dim": 14336,
        "rope_theta": 500000.0,
        "max_seq_len": 8192,
    },
}
