"""Model shape: one typed config with its checks and parameter counts. Its named shapes are
presets.py; MLA's and RoPE scaling's own fields are mla_config.py and rope_scaling.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kiln.model.mla_config import MLAConfig, mla_params
from kiln.model.presets import PRESETS
from kiln.model.rope_scaling import RopeScaling
from kiln.platform.errors import ConfigError


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
    n_experts: int = Field(
        0, ge=0, description="0: dense feed-forward; >0: MoE (after first_dense_layers)."
    )
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
    mla: MLAConfig | None = Field(
        None, description="Multi-head Latent Attention instead of GQA (DeepSeek-V3); None: GQA."
    )
    moe_hidden_dim: int | None = Field(
        None, gt=0, description="Width of each routed expert (None: ffn_hidden_dim)."
    )
    n_shared_experts: int = Field(
        0, ge=0, description="MoE layers also run this many always-on experts (DeepSeek-V3: 1)."
    )
    first_dense_layers: int = Field(
        0, ge=0, description="The first N layers stay dense (DeepSeek-V3 first_k_dense_replace)."
    )
    router_score: Literal["softmax", "sigmoid"] = Field(
        "softmax",
        description="MoE router scores: softmax (Mixtral, Qwen) or sigmoid with a selection bias "
        "and grouped top-k (DeepSeek-V3).",
    )
    n_expert_groups: int = Field(
        1, gt=0, description="Sigmoid router: experts fall into this many groups (n_group)."
    )
    topk_groups: int = Field(
        1, gt=0, description="Sigmoid router: tokens choose experts from this many best groups."
    )
    routed_scaling_factor: float = Field(
        1.0, gt=0, description="Sigmoid router: routed experts' weights are multiplied by this."
    )
    router_bias_update_rate: float = Field(
        0.001,
        ge=0,
        description="Sigmoid router: after each optimizer step its selection bias moves by this "
        "times sign(mean load - expert load), aux-loss-free balancing (DeepSeek-V3: 0.001; "
        "0 keeps the bias fixed).",
    )
    mtp_depth: int = Field(
        0,
        ge=0,
        description="Multi-token prediction (DeepSeek-V3): this many sequential training-only "
        "modules, the k-th predicting the token k+1 ahead through one more block and the shared "
        "embedding and output head (0: none; DeepSeek-V3: 1). Serving ignores them.",
    )
    mtp_loss_weight: float = Field(
        0.3,
        ge=0,
        description="Multi-token prediction: the training loss adds this times the mean of the "
        "modules' losses (DeepSeek-V3: 0.3, later 0.1).",
    )
    attention_backend: Literal["auto", "sdpa", "flash_attn", "te", "invariant"] = Field(
        "auto",
        description="auto: flash-attn or Transformer Engine on GPUs that have them, else SDPA. "
        "invariant: plain matmuls whose fp32 results on CPU do not depend on how many queries "
        "and keys share a forward (a KV-cache decode equals a full forward bit for bit; RL "
        "loops use it), at the cost of materialising the scores.",
    )
    fused_projections: bool = Field(
        False,
        description="Hold attention's wq/wk/wv as one wqkv Linear and the gated FFN's w1/w3 as "
        "one w13 (2 input GEMMs per block instead of 5). In memory only: checkpoints and "
        "exports keep the unfused names. Under parallel.tp > 1 each rank holds its own heads' "
        "q/k/v (and gate/up) rows. Not with LoRA; MLA attention (DeepSeek) stays unfused, its "
        "dense FFNs fuse.",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.mla is not None:
            self._check_mla()
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
        if self.router_score == "sigmoid":
            self._check_grouped_router()
        return self

    def _check_mla(self) -> None:
        """MLA's heads: RoPE runs over qk_rope_head_dim (head_dim), every head has its own k/v."""
        rope = self.mla.qk_rope_head_dim
        if self.head_dim not in (None, rope):
            raise ConfigError(
                f"model.head_dim ({self.head_dim}) must equal model.mla.qk_rope_head_dim ({rope}) "
                "with MLA (or be left unset)"
            )
        for field in ("qkv_bias", "qk_norm", "sliding_window", "attn_logit_softcap"):
            if getattr(self, field):
                raise ConfigError(f"model.{field} is not supported with model.mla")
        self.head_dim = rope
        self.n_kv_heads = self.n_heads

    def _check_grouped_router(self) -> None:
        e, g = self.n_experts, self.n_expert_groups
        if not e:
            raise ConfigError("model.router_score=sigmoid needs model.n_experts > 0")
        if e % g or (g > 1 and e // g < 2):
            raise ConfigError(
                f"model.n_expert_groups ({g}) must divide model.n_experts ({e}) into groups of "
                "at least 2"
            )
        if not 1 <= self.topk_groups <= g or self.top_k > self.topk_groups * (e // g):
            raise ConfigError(
                f"model.topk_groups ({self.topk_groups}) must be in [1, n_expert_groups={g}] and "
                f"hold top_k ({self.top_k}) experts"
            )

    def checkpoint_dump(self) -> dict:
        """The config a checkpoint's kiln.json records: its shape, without in-memory layout
        choices (fused_projections), which the run reading it makes for itself."""
        return self.model_dump(mode="json", exclude={"fused_projections"})

    def is_moe_layer(self, layer_id: int) -> bool:
        """Whether this layer's feed-forward is a mixture of experts (else dense)."""
        return self.n_experts > 0 and layer_id >= self.first_dense_layers

    @property
    def expert_hidden_dim(self) -> int:
        return self.moe_hidden_dim or self.ffn_hidden_dim

    def is_local_layer(self, layer_id: int) -> bool:
        """Whether this layer attends within `sliding_window` (else over the whole prefix)."""
        if self.sliding_window is None:
            return False
        return self.sliding_window_pattern is None or (layer_id + 1) % self.sliding_window_pattern

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        """A named shape (`tiny`, `125m`, `1b`, `llama3_8b`, `deepseek_v3`), optionally with
        fields overridden."""
        if name not in PRESETS:
            raise ConfigError(
                f"model preset {name!r} is unknown; expected one of {sorted(PRESETS)}"
            )
        return cls(**{**PRESETS[name], **overrides})

    def num_params(self, exclude_embedding: bool = False) -> int:
        """Parameter count computed from the shape (no model needed: FLOP and memory planning)."""
        d = self.dim
        if self.mla is not None:
            attn = mla_params(self.mla, d, self.n_heads)
        else:
            q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
            attn = d * q * 2 + d * kv * 2 + ((q + 2 * kv) if self.qkv_bias else 0)
            attn += 2 * self.head_dim if self.qk_norm else 0
        norms = (4 if self.sandwich_norm else 2) * d
        layers = sum(attn + self.ffn_params(i) + norms for i in range(self.n_layers))
        # each MTP module: its block (layer n_layers + k), two input norms, the 2d -> d
        # projection and its head norm; the embedding and output head are the main model's
        mtp_layers = range(self.n_layers, self.n_layers + self.mtp_depth)
        layers += sum(attn + self.ffn_params(i) + norms + 3 * d + 2 * d * d for i in mtp_layers)
        emb = self.vocab_size * d
        out = 0 if self.tie_embeddings else self.vocab_size * d
        total = layers + d + emb + out
        return total - emb if exclude_embedding else total

    def ffn_params(self, layer_id: int, active: bool = False) -> int:
        """One layer's feed-forward parameters: dense, or router + experts + shared experts
        (`active`: only the top_k routed experts a token runs)."""
        d = self.dim
        if not self.is_moe_layer(layer_id):
            return 3 * d * self.ffn_hidden_dim
        h = self.expert_hidden_dim
        routed = self.top_k if active else self.n_experts
        return d * self.n_experts + 3 * d * h * (routed + self.n_shared_experts)
