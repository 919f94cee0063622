"""Multi-token prediction (DeepSeek-V3, section 2.2): extra training signal from D small modules
that each look one token further ahead.

Module k (1..D) at position t combines the previous depth's hidden state at t with the embedding
of token t+k, runs one transformer block and predicts token t+k+1 through the main model's
output head:

    h_k = norm_k(block_k(eh_proj_k([enorm_k(embed(token[t+k])); hnorm_k(h_{k-1})])))

h_0 is the main model's hidden state after its final norm (what its head reads), and h_k feeds
both the shared head and module k+1, as Megatron-LM's MTP does; the [embedding; hidden] order of
the concatenation is the one DeepSeek's released `eh_proj` weights expect. Inputs and targets are
shifted left by k within the sequence and the last k positions ignored (a causal block never lets
them reach the positions that count), so every module keeps the [B, S] shape. The embedding and
head are shared with the main model, the rest is training-only: the main model's logits never
read these modules.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kiln.model.chunked_cross_entropy import IGNORE_INDEX
from kiln.model.norms import build_norm

# (hidden [B, S, D], targets [B, S]) -> the mean cross entropy through the shared output head
HeadLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (module's block) -> the (cos, sin) RoPE tables its layer uses
RopeTables = Callable[[nn.Module], tuple[torch.Tensor, torch.Tensor]]


class MTPModule(nn.Module):
    """One depth: enorm/hnorm, the 2d -> d projection `eh_proj`, one transformer `block` and the
    `norm` before the shared head (DeepSeek's `shared_head.norm`)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool, block: nn.Module):
        super().__init__()
        self.enorm = build_norm(dim, eps, unit_offset)
        self.hnorm = build_norm(dim, eps, unit_offset)
        self.eh_proj = nn.Linear(2 * dim, dim, bias=False)
        self.block = block
        self.norm = build_norm(dim, eps, unit_offset)

    def forward(
        self,
        hidden: torch.Tensor,
        embedded: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hidden [B, S, D] (depth k-1) and embedded [B, S, D] (tokens shifted by k) -> the
        normed hidden state of depth k."""
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        return self.norm(self.block(x, rope_cos, rope_sin, positions=positions))

    def init_weights(self, base_std: float, init_std: float) -> None:
        for norm in (self.enorm, self.hnorm, self.norm):
            norm.reset_parameters()
        nn.init.normal_(self.eh_proj.weight, mean=0.0, std=base_std)
        self.block.init_weights(init_std)


def shift_left(x: torch.Tensor, k: int, fill: int) -> torch.Tensor:
    """x[:, t + k] at position t; `fill` at the last k positions."""
    tail = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], tail], dim=1)


def mtp_losses(
    modules: nn.ModuleList,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    embed: Callable[[torch.Tensor], torch.Tensor],
    head_loss: HeadLoss,
    rope_tables: RopeTables,
    positions: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Each depth's mean cross entropy. hidden [B, S, D]: the main model's normed last hidden
    state; tokens [B, S] its input; labels [B, S] its next-token targets (-100 ignored), so the
    target of depth k at t is labels[t + k]."""
    losses = []
    for k, module in enumerate(modules, start=1):
        cos, sin = rope_tables(module.block)
        embedded = embed(shift_left(tokens, k, 0))
        hidden = module(hidden, embedded, cos, sin, positions=positions)
        losses.append(head_loss(hidden, shift_left(labels, k, IGNORE_INDEX)))
    return losses
