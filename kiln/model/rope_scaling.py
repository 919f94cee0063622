"""RoPE frequency scaling's config: Llama-3.1's and YaRN's parameters (rope.py and yarn.py
apply them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RopeScaling(BaseModel):
    """RoPE frequency scaling for long contexts: Llama-3.1's (`rope_type: llama3`) or YaRN
    (`rope_type: yarn`, DeepSeek-V3), as HF `rope_parameters` / `rope_scaling` name them."""

    model_config = ConfigDict(extra="forbid")

    rope_type: Literal["llama3", "yarn"] = Field(
        "llama3", description="Scaling scheme: llama3 (Llama 3.1) or yarn (DeepSeek-V3)."
    )
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
    beta_fast: float = Field(
        32.0, gt=0, description="YaRN: rotations above which dims extrapolate."
    )
    beta_slow: float = Field(1.0, gt=0, description="YaRN: rotations below which dims interpolate.")
    mscale: float | None = Field(
        None, description="YaRN: numerator scale of the cos/sin attention factor (DeepSeek: 1.0)."
    )
    mscale_all_dim: float | None = Field(
        None,
        description="YaRN: denominator scale of the attention factor; with MLA the softmax scale "
        "is also multiplied by mscale(factor, mscale_all_dim)**2 (DeepSeek: 1.0).",
    )
    attention_factor: float | None = Field(
        None, gt=0, description="YaRN: cos/sin multiplier (None: derived from the mscales)."
    )
    truncate: bool = Field(True, description="YaRN: round the correction range to whole dims.")
