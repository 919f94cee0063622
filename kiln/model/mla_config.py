"""Multi-head Latent Attention's shape (mla.py is the module) and its parameter count."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MLAConfig(BaseModel):
    """Multi-head Latent Attention (DeepSeek-V2/V3): low-rank q and kv, decoupled RoPE key."""

    model_config = ConfigDict(extra="forbid")

    kv_lora_rank: int = Field(512, gt=0, description="Width of the compressed kv latent.")
    q_lora_rank: int | None = Field(
        1536, gt=0, description="Width of the compressed query (None: one full q projection)."
    )
    qk_nope_head_dim: int = Field(128, gt=0, description="Per-head q/k dims without RoPE.")
    qk_rope_head_dim: int = Field(
        64, gt=0, description="Per-head q dims with RoPE; the one RoPE key all heads share."
    )
    v_head_dim: int = Field(128, gt=0, description="Per-head value width.")
    rope_interleave: bool = Field(
        True,
        description="Hugging Face weights lay RoPE dims out in interleaved pairs (DeepSeek's "
        "rope_interleave); kiln permutes them to its own layout on import and back on export.",
    )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def cache_width(self) -> int:
        """Numbers cached per token per layer: the latent and the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def mla_params(mla: MLAConfig, dim: int, n_heads: int) -> int:
    """Parameters of one MLA layer: q (low-rank or full), kv down/up projections, latent norms,
    output projection."""
    q_out = n_heads * mla.qk_head_dim
    r = mla.q_lora_rank
    q = dim * q_out if r is None else dim * r + r + r * q_out
    kv = dim * mla.cache_width() + mla.kv_lora_rank
    kv += mla.kv_lora_rank * n_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return q + kv + n_heads * mla.v_head_dim * dim
