"""A Llama-style decoder, read top to bottom. No parallelism here (see kiln/training/parallel).

One forward serves training and generation: `Transformer.forward(tokens, positions, kv_cache)`.
Each module initialises its own weights (`init_weights(init_std)`, as in torchtitan): input
projections and embeddings draw from N(0, 0.02), projections that write into the residual stream
(attention `wo`, feed-forward `w2`) from N(0, init_std).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.attention import AttentionCore
from kiln.model.chunked_cross_entropy import linear_cross_entropy
from kiln.model.config import ModelConfig
from kiln.model.fused_projections import Fusion, fuse
from kiln.model.kv_cache import KVCache, LayerKV
from kiln.model.mla import MultiHeadLatentAttention
from kiln.model.moe import MoE
from kiln.model.mtp import MTPModule, mtp_losses
from kiln.model.norms import build_norm
from kiln.model.rope import apply_rope, rope_rows, rope_tables
from kiln.model.router import SigmoidGroupedRouter
from kiln.model.softcap import soft_cap

BASE_STD = 0.02  # Llama / GPT-2 init for embeddings and input projections
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def _normal(linear: nn.Module, std: float) -> None:
    nn.init.normal_(linear.weight, mean=0.0, std=std)
    if getattr(linear, "bias", None) is not None:
        nn.init.zeros_(linear.bias)


def _init_rows(linear: nn.Linear, sizes: tuple[int, ...], stds: tuple[float, ...]) -> None:
    """Draw a fused Linear's row blocks one after another, as the unfused Linears draw: the same
    seed gives the same weights fused or not."""
    for rows, std in zip(linear.weight.split(list(sizes)), stds, strict=True):
        nn.init.normal_(rows, mean=0.0, std=std)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


class Attention(nn.Module):
    """Multi-head attention with GQA/MQA (n_kv_heads <= n_heads), RoPE and an exchangeable core.

    With `cfg.fused_projections` q, k and v come from one Linear `wqkv` (rows [q; k; v], or
    per-rank blocks of them under tensor parallelism); its state dict still names them wq, wk,
    wv (fused_projections.py)."""

    def __init__(self, cfg: ModelConfig, layer_id: int = 0):
        super().__init__()
        self.head_dim = cfg.head_dim
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.qkv_sizes = (q_dim, kv_dim, kv_dim)
        if cfg.fused_projections:
            self.wqkv = nn.Linear(cfg.dim, sum(self.qkv_sizes), bias=cfg.qkv_bias)
            fuse(self, Fusion("wqkv", ("wq", "wk", "wv"), self.qkv_sizes))
        else:
            self.wq = nn.Linear(cfg.dim, q_dim, bias=cfg.qkv_bias)
            self.wk = nn.Linear(cfg.dim, kv_dim, bias=cfg.qkv_bias)
            self.wv = nn.Linear(cfg.dim, kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        # qk-norm (Qwen3, Gemma 3): one RMSNorm shared by all heads, over each head's width
        q_norm, k_norm = (
            (build_norm(cfg.head_dim, cfg.norm_eps, cfg.norm_unit_offset) for _ in range(2))
            if cfg.qk_norm
            else (None, None)
        )
        self.q_norm, self.k_norm = q_norm, k_norm
        window = cfg.sliding_window if cfg.is_local_layer(layer_id) else None
        scalar = cfg.query_pre_attn_scalar
        self.core = AttentionCore(
            cfg.head_dim,
            window,
            cfg.attention_backend,
            scale=None if scalar is None else scalar**-0.5,
            softcap=cfg.attn_logit_softcap,
        )

    def forward(
        self,
        x: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: LayerKV | None = None,
    ) -> torch.Tensor:
        """x [B, S, D]; RoPE rows of `positions` (default 0..S-1) from the full cos/sin tables.

        The rows are gathered here, per layer, from x's own length: under sequence parallelism
        the block's input is sharded along the sequence and x is the gathered whole."""
        B, S, _ = x.shape
        q, k, v = self._project(x)
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = q.view(B, S, -1, self.head_dim)
        k = k.view(B, S, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, S, -1, self.head_dim).transpose(1, 2)
        cos, sin = rope_rows(rope_cos, rope_sin, S, positions)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.core(q, k, v) if kv_cache is None else kv_cache.attend(q, k, v, self.core)
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if hasattr(self, "wqkv"):
            # under tensor parallelism the output is this rank's block [q_r; k_r; v_r]
            return self.wqkv(x).split(list(self.fusion.block_sizes), dim=-1)
        return self.wq(x), self.wk(x), self.wv(x)

    def init_weights(self, init_std: float) -> None:
        if hasattr(self, "wqkv"):
            _init_rows(self.wqkv, self.qkv_sizes, (BASE_STD,) * 3)
        else:
            for linear in (self.wq, self.wk, self.wv):
                _normal(linear, BASE_STD)
        _normal(self.wo, init_std)
        if self.q_norm is not None:
            self.q_norm.reset_parameters()
            self.k_norm.reset_parameters()


class FeedForward(nn.Module):
    """Gated FFN: w2(act(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down. SwiGLU with silu,
    GeGLU with gelu_tanh. `fused`: gate and up are one Linear `w13` (rows [gate; up]), still
    named w1 and w3 in its state dict (fused_projections.py)."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu", fused: bool = False):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.hidden_dim = hidden_dim
        if fused:
            self.w13 = nn.Linear(dim, 2 * hidden_dim, bias=False)
            fuse(self, Fusion("w13", ("w1", "w3"), (hidden_dim,) * 2, ("w1", "w2", "w3")))
        else:
            self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        if not fused:
            self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "w13"):  # [gate; up], or this rank's [gate_r; up_r] under TP
            gate, up = self.w13(x).chunk(2, dim=-1)
        else:
            gate, up = self.w1(x), self.w3(x)
        return self.w2(self.act(gate) * up)

    def init_weights(self, init_std: float) -> None:
        # draws in the unfused order (w1, w2, w3): the same seed gives the same weights
        if hasattr(self, "w13"):
            gate, up = self.w13.weight.chunk(2)
            nn.init.normal_(gate, mean=0.0, std=BASE_STD)
            _normal(self.w2, init_std)
            nn.init.normal_(up, mean=0.0, std=BASE_STD)
        else:
            _normal(self.w1, BASE_STD)
            _normal(self.w2, init_std)
            _normal(self.w3, BASE_STD)


def _router(cfg: ModelConfig) -> nn.Module | None:
    """DeepSeek-V3's sigmoid grouped router, or None for the MoE's own softmax routing."""
    if cfg.router_score != "sigmoid":
        return None
    return SigmoidGroupedRouter(
        cfg.n_experts,
        cfg.top_k,
        cfg.n_expert_groups,
        cfg.topk_groups,
        cfg.routed_scaling_factor,
        cfg.norm_topk_prob,
    )


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention (GQA, or MLA with `cfg.mla`) then feed-forward (dense)
    or mixture of experts (plus always-on shared experts with `n_shared_experts`); with
    `sandwich_norm` each branch's output is normed too before it joins the residual (Gemma)."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.moe_enabled = cfg.is_moe_layer(layer_id)
        self.local_rope = cfg.rope_local_theta is not None and cfg.is_local_layer(layer_id)
        self.attention_norm = build_norm(cfg.dim, cfg.norm_eps, cfg.norm_unit_offset)
        attention = MultiHeadLatentAttention if cfg.mla is not None else Attention
        self.attention = attention(cfg, layer_id)
        self.ffn_norm = build_norm(cfg.dim, cfg.norm_eps, cfg.norm_unit_offset)
        sandwich = (
            (build_norm(cfg.dim, cfg.norm_eps, cfg.norm_unit_offset) for _ in range(2))
            if cfg.sandwich_norm
            else (None, None)
        )
        self.post_attention_norm, self.post_ffn_norm = sandwich
        self.shared_experts = None
        if self.moe_enabled:
            self.moe = MoE(
                cfg.dim,
                cfg.expert_hidden_dim,
                cfg.n_experts,
                cfg.top_k,
                cfg.capacity_factor,
                norm_topk_prob=cfg.norm_topk_prob,
                router=_router(cfg),
            )
            if cfg.n_shared_experts:  # every token's dense SwiGLU beside the routed experts
                shared_dim = cfg.n_shared_experts * cfg.expert_hidden_dim
                self.shared_experts = FeedForward(
                    cfg.dim, shared_dim, cfg.ffn_activation, cfg.fused_projections
                )
        else:
            self.feed_forward = FeedForward(
                cfg.dim, cfg.ffn_hidden_dim, cfg.ffn_activation, cfg.fused_projections
            )

    def forward(
        self,
        x: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> torch.Tensor:
        layer_kv = kv_cache.layer(self.layer_id) if kv_cache is not None else None
        a = self.attention(
            self.attention_norm(x), rope_cos, rope_sin, positions=positions, kv_cache=layer_kv
        )
        h = x + (a if self.post_attention_norm is None else self.post_attention_norm(a))
        mlp = self.moe if self.moe_enabled else self.feed_forward
        normed = self.ffn_norm(h)
        m = mlp(normed)
        if self.shared_experts is not None:
            m = m + self.shared_experts(normed)
        return h + (m if self.post_ffn_norm is None else self.post_ffn_norm(m))

    def init_weights(self, init_std: float) -> None:
        self.attention_norm.reset_parameters()
        self.attention.init_weights(init_std)
        self.ffn_norm.reset_parameters()
        for norm in (self.post_attention_norm, self.post_ffn_norm):
            if norm is not None:
                norm.reset_parameters()
        (self.moe if self.moe_enabled else self.feed_forward).init_weights(init_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(init_std)


class Transformer(nn.Module):
    """tokens [B, S] -> logits [B, S, V]. As a pipeline stage, parts set to None are skipped."""

    def __init__(self, cfg: ModelConfig, *, init: bool = True):
        """`init=False` draws no weights and builds no RoPE tables: for a build on the meta device
        whose storage comes later (`to_empty`, then `init_weights()` or loaded weights)."""
        super().__init__()
        self.cfg = cfg
        # nn.Embedding draws N(0, 1) unless handed its weight (a meta normal_ imports torch._dynamo)
        empty = None if init else torch.empty(cfg.vocab_size, cfg.dim)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, _weight=empty)
        # A ModuleDict keyed by global index keeps names like `layers.7` in every pipeline stage.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in range(cfg.n_layers)})
        self.norm = build_norm(cfg.dim, cfg.norm_eps, cfg.norm_unit_offset)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # training-only multi-token prediction (mtp.py); module k's block is layer n_layers + k.
        # Built on meta, so that constructing them draws nothing from the generator and the
        # main model's init stays that of mtp_depth 0; `init_weights` fills them after the head.
        self.mtp = None
        if cfg.mtp_depth:
            with torch.device("meta"):
                self.mtp = nn.ModuleList(
                    MTPModule(
                        cfg.dim,
                        cfg.norm_eps,
                        cfg.norm_unit_offset,
                        TransformerBlock(cfg, cfg.n_layers + k),
                    )
                    for k in range(cfg.mtp_depth)
                )
            if init:
                self.mtp.to_empty(device=self.tok_embeddings.weight.device)
        # the mean MTP loss of the last forward given `mtp_labels` (None otherwise)
        self.mtp_loss: torch.Tensor | None = None
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        # the sliding-window layers' own RoPE tables when rope_local_theta is set (Gemma 3)
        self.register_buffer("rope_local_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_local_sin", torch.empty(0), persistent=False)
        if init:
            self.init_weights()

    def _rope_tables(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        return rope_tables(c.head_dim, c.max_seq_len, c.rope_theta, device, c.rope_scaling)

    def init_buffers(self, device: torch.device | None = None) -> None:
        """(Re)build the RoPE tables (non-persistent buffers: never in a checkpoint)."""
        device = device or self.rope_cos.device
        self.rope_cos, self.rope_sin = self._rope_tables(device)
        c = self.cfg
        if c.rope_local_theta is not None:
            self.rope_local_cos, self.rope_local_sin = rope_tables(
                c.head_dim, c.max_seq_len, c.rope_local_theta, device
            )

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Llama/GPT-2 init (std 0.02, residual projections scaled by depth); rebuilds RoPE tables.

        Call after `to_empty()` when the model was built on the meta device. Deterministic:
        modules draw in the order they appear (embedding, blocks, norm, output, MTP modules).
        """
        self.init_buffers(buffer_device)
        init_std = BASE_STD / math.sqrt(2 * self.cfg.n_layers)
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=BASE_STD)
        for layer in self.layers.values():
            layer.init_weights(init_std)
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None:  # tied: redraws the shared embedding, as it always has
            nn.init.normal_(self.output.weight, mean=0.0, std=BASE_STD)
        for module in self.mtp or ():
            module.init_weights(BASE_STD, init_std)

    def __getstate__(self):
        # mtp_loss is a graph tensor after a training forward; copies and pickles keep its value.
        state = dict(super().__getstate__())
        if state.get("mtp_loss") is not None:
            state["mtp_loss"] = state["mtp_loss"].detach()
        return state

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.cfg.embed_scale:  # rounded to the model dtype first, as Gemma does
            h = h * torch.tensor(self.cfg.dim**0.5, dtype=h.dtype)
        return h

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        logits_positions: tuple[torch.Tensor, torch.Tensor] | None = None,
        labels: torch.Tensor | None = None,
        loss_chunk_tokens: int = 1024,
        mtp_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens [B, S] (or hidden states [B, S, D] in a later pipeline stage) -> logits.

        positions: RoPE positions, [S] or [B, S] (default 0..S-1; context parallelism passes each
        rank's global positions). kv_cache: append these tokens to the cache and attend over it
        (see `KVCache`); positions then default to each row's next slots. logits_positions:
        (rows, cols) index tensors: logits [N, V] of those positions only, as decoding needs (the
        head of a 32k vocabulary is ~20% of a 125M model's FLOPs per token). labels [B, S]: return
        the mean next-token cross entropy instead of logits, computed `loss_chunk_tokens` tokens
        at a time so the full logits never exist (chunked_cross_entropy.py). It is computed
        here, inside forward, so FSDP's hooks have the output weight gathered while it runs.
        mtp_labels [B, S]: the next-token targets (-100 ignored) of a model with MTP modules;
        forward then also sets `self.mtp_loss`, the mean of their losses (mtp.py). The return
        value stays the main model's.
        """
        h = self._embed(tokens) if self.tok_embeddings is not None else tokens
        if kv_cache is not None:
            seq_len = h.shape[1]
            positions = kv_cache.positions(seq_len) if positions is None else positions
            kv_cache.begin(seq_len)
        tables = (self.rope_cos, self.rope_sin)
        local_tables = (self.rope_local_cos, self.rope_local_sin)
        for layer in self.layers.values():
            cos, sin = local_tables if layer.local_rope else tables
            h = layer(h, cos, sin, positions=positions, kv_cache=kv_cache)
        if kv_cache is not None:
            kv_cache.advance(h.shape[1])
        self.mtp_loss = None
        if mtp_labels is not None and self.mtp is not None:
            self.mtp_loss = self._mtp_loss(h, tokens, mtp_labels, positions, loss_chunk_tokens)
        if logits_positions is not None:
            h = h[logits_positions]
        h = self.norm(h) if self.norm is not None else h
        if self.output is None:
            return h
        if labels is not None:
            softcap = self.cfg.final_logit_softcap
            return linear_cross_entropy(h, self.output.weight, labels, loss_chunk_tokens, softcap)
        return soft_cap(self.output(h), self.cfg.final_logit_softcap)

    def _mtp_loss(
        self,
        h: torch.Tensor,
        tokens: torch.Tensor,
        labels: torch.Tensor,
        positions: torch.Tensor | None,
        chunk_tokens: int,
    ) -> torch.Tensor:
        """The mean of the MTP modules' losses, from the last block's output h."""
        softcap = self.cfg.final_logit_softcap

        def head_loss(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return linear_cross_entropy(hidden, self.output.weight, targets, chunk_tokens, softcap)

        def rope_tables(block: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
            if block.local_rope:
                return self.rope_local_cos, self.rope_local_sin
            return self.rope_cos, self.rope_sin

        losses = mtp_losses(
            self.mtp, self.norm(h), tokens, labels, self._embed, head_loss, rope_tables, positions
        )
        return torch.stack(losses).mean()
