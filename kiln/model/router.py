"""DeepSeek-V3's router: sigmoid scores, a selection bias, grouped top-k, scaled weights.

Each expert scores sigmoid(logit) on its own (no softmax over experts). Selection adds
`e_score_correction_bias` (aux-loss-free balancing: the bias steers which experts are chosen,
never how much they weigh), keeps the `topk_groups` best of `n_groups` expert groups (a group
scores the sum of its two best experts) and takes the top k experts inside them. The chosen
experts weigh their unbiased scores, renormalised to sum to 1 with `norm_topk_prob`, times
`scaling`. The same maths as transformers' DeepseekV3TopkRouter.

Training counts the assignments each expert receives (`load`); after each optimizer step the
trainer nudges the bias by `rate * sign(mean load - load)` (kiln/training/router_balance.py):
overloaded experts become less likely to be chosen, idle ones more, with no loss term. The
count happens when the routing weights' gradient is computed, so only forwards that are
trained on count: not a pipeline stage's shape-inference forward, not a recompute.
"""

from __future__ import annotations

import torch
from torch import nn


class SigmoidGroupedRouter(nn.Module):
    """router logits [T, E] (fp32) -> (weights [T, k], expert ids [T, k], scores for the
    load-balancing statistics [T, E], each row summing to 1)."""

    def __init__(
        self,
        n_experts: int,
        top_k: int,
        n_groups: int = 1,
        topk_groups: int = 1,
        scaling: float = 1.0,
        norm_topk_prob: bool = True,
    ):
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.n_groups, self.topk_groups = n_groups, topk_groups
        self.scaling, self.norm_topk_prob = scaling, norm_topk_prob
        # Not trained by gradients: a persistent buffer, in checkpoints and HF files as a weight.
        self.register_buffer("e_score_correction_bias", torch.zeros(n_experts))
        # Assignments per expert since the last bias update (training forwards only).
        self.load: torch.Tensor | None = None

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = logits.float().sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        if self.n_groups > 1:
            grouped = choice.view(-1, self.n_groups, self.n_experts // self.n_groups)
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # [T, G]
            best = group_scores.topk(self.topk_groups, dim=-1, sorted=False)[1]
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            keep = keep.unsqueeze(-1).expand_as(grouped).reshape(-1, self.n_experts)
            choice = choice.masked_fill(~keep, float("-inf"))
        top_idx = choice.topk(self.top_k, dim=-1, sorted=False)[1]
        top_w = scores.gather(1, top_idx)
        if self.norm_topk_prob:
            top_w = top_w / (top_w.sum(dim=-1, keepdim=True) + 1e-20)
        top_w = top_w * self.scaling
        if self.training and top_w.requires_grad:
            top_w.register_hook(lambda _grad: self._count(top_idx))
        return top_w, top_idx, scores / scores.sum(dim=-1, keepdim=True)

    def _count(self, top_idx: torch.Tensor) -> None:
        ones = torch.ones(top_idx.numel(), device=top_idx.device)
        load = torch.zeros(self.n_experts, device=top_idx.device).index_add_(
            0, top_idx.reshape(-1), ones
        )
        self.load = load if self.load is None else self.load + load

    def take_load(self) -> torch.Tensor:
        """The assignments counted since the last call (zeros if none), and start again."""
        load = self.load
        self.load = None
        return load if load is not None else torch.zeros_like(self.e_score_correction_bias)

    def reset_parameters(self) -> None:
        self.e_score_correction_bias.zero_()
