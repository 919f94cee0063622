"""Multi-head Latent Attention (DeepSeek-V2/V3): keys and values come from one low-rank latent.

Per token, `wkv_a` writes a latent of kv_lora_rank numbers (normed by `kv_norm`) and one RoPE key
of qk_rope_head_dim numbers shared by every head. `wkv_b` expands the latent into each head's
un-rotated key part (qk_nope_head_dim) and its value (v_head_dim); a head's key is that part
followed by the shared RoPE key. Queries come from `wq`, or with q_lora_rank through a latent of
their own (`wq_a` -> `q_norm` -> `wq_b`), split the same way. The KV cache holds the latent and
the rotated RoPE key only, kv_lora_rank + qk_rope_head_dim numbers per token and layer, and
expands them at every step (kiln/model/kv_cache.py).

Names follow torchtitan's DeepSeek-V3; kiln/model/formats/hf_names.py maps them to HF's. RoPE
runs in HF's rotate_half layout; DeepSeek's interleaved layout is permuted at the format
boundary. The softmax scale is qk_head_dim**-0.5 times YaRN's mscale**2 (kiln/model/yarn.py).
"""

from __future__ import annotations

import torch
from torch import nn

from kiln.model.attention import AttentionCore
from kiln.model.config import ModelConfig
from kiln.model.kv_cache import LayerKV
from kiln.model.norms import RMSNorm
from kiln.model.rope import apply_rope, rope_rows
from kiln.model.yarn import softmax_mscale

BASE_STD = 0.02
# DeepSeek's latent norms use their own epsilon, not the model's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class MultiHeadLatentAttention(nn.Module):
    """x [B, S, D] -> [B, S, D], the same call as `Attention` (RoPE tables, positions, cache)."""

    def __init__(self, cfg: ModelConfig, layer_id: int = 0):
        super().__init__()
        m = cfg.mla
        self.nope_dim, self.rope_dim = m.qk_nope_head_dim, m.qk_rope_head_dim
        self.v_dim = m.v_head_dim
        self.qk_head_dim, self.kv_lora_rank = m.qk_head_dim, m.kv_lora_rank
        q_out = cfg.n_heads * m.qk_head_dim
        if m.q_lora_rank is None:
            self.wq = nn.Linear(cfg.dim, q_out, bias=False)
            self.wq_a = self.q_norm = self.wq_b = None
        else:
            self.wq = None
            self.wq_a = nn.Linear(cfg.dim, m.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(m.q_lora_rank, LATENT_NORM_EPS)
            self.wq_b = nn.Linear(m.q_lora_rank, q_out, bias=False)
        self.wkv_a = nn.Linear(cfg.dim, m.cache_width(), bias=False)
        self.kv_norm = RMSNorm(m.kv_lora_rank, LATENT_NORM_EPS)
        kv_out = cfg.n_heads * (m.qk_nope_head_dim + m.v_head_dim)
        self.wkv_b = nn.Linear(m.kv_lora_rank, kv_out, bias=False)
        self.wo = nn.Linear(cfg.n_heads * m.v_head_dim, cfg.dim, bias=False)
        # Where the one RoPE key enters every head: tensor parallelism sums its gradient over
        # the ranks' heads here (kiln/training/parallel/mla_tensor_parallel.py).
        self.shared_key = nn.Identity()
        scale = m.qk_head_dim**-0.5 * softmax_mscale(cfg.rope_scaling)
        self.core = AttentionCore(m.qk_head_dim, None, cfg.attention_backend, scale=scale)

    def forward(
        self,
        x: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: LayerKV | None = None,
    ) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.wq(x) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(B, S, -1, self.qk_head_dim).transpose(1, 2)  # -1 heads: TP keeps a slice
        q_nope, q_rot = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rot = self.wkv_a(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = self.kv_norm(latent).unsqueeze(1)  # [B, 1, S, r]: one "head"
        k_rot = k_rot.unsqueeze(1)  # [B, 1, S, rope]: shared by every head
        cos, sin = rope_rows(rope_cos, rope_sin, S, positions)
        q_rot, k_rot = apply_rope(q_rot, cos, sin), apply_rope(k_rot, cos, sin)
        mask = None
        if kv_cache is not None:  # the cache holds the latent and the rotated key, nothing more
            latent, k_rot, mask = kv_cache.update(latent, k_rot)
        k_nope, v = self._expand(latent.squeeze(1))
        k_rot = self.shared_key(k_rot)
        k = torch.cat([k_nope, k_rot.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        out = self.core(torch.cat([q_nope, q_rot], dim=-1), k, v, mask=mask)
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))

    def _expand(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """latent [B, T, r] -> each head's un-rotated key [B, H, T, nope] and value [B, H, T, v]."""
        B, T, _ = latent.shape
        kv = self.wkv_b(latent).view(B, T, -1, self.nope_dim + self.v_dim).transpose(1, 2)
        return kv.split([self.nope_dim, self.v_dim], dim=-1)

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wq_a, self.wq_b, self.wkv_a, self.wkv_b):
            if linear is not None:
                nn.init.normal_(linear.weight, mean=0.0, std=BASE_STD)
        nn.init.normal_(self.wo.weight, mean=0.0, std=init_std)
        for norm in (self.q_norm, self.kv_norm):
            if norm is not None:
                norm.reset_parameters()
