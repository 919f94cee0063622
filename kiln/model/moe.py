"""Mixture of experts: Mixtral-style top-k routing over SwiGLU experts, with a load-balancing loss.

The layer holds no parallelism. Expert parallelism (kiln.training.parallel.expert_parallel)
swaps `run_experts` for an all-to-all dispatch; context parallelism sets `reduce_stats` so the
load-balancing statistics cover the whole sequence rather than one rank's slice of it.

Speed: expert weights live as 3-D parameters [E, ., .] (`GroupedExperts`) that three grouped
GEMMs over all experts at once (`torch._grouped_mm`, with the rows of expert e at
offsets[e-1]:offsets[e]) take as they are, in the compute dtype (autocast's, else the
activations'; under FSDP2 that is the mixed-precision policy's param_dtype), with at most one
host sync per layer (none without a capacity). Without a usable `_grouped_mm` (older torch, an
unaligned width, a dtype the device's kernel refuses) a loop over experts does the same maths.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class GroupedExperts(nn.Module):
    """n SwiGLU experts as 3-D weights, the layout grouped GEMMs take without any copy:
    w13 [E, 2H, D] (gate rows, then up rows: one GEMM for both) and w2 (down) [E, D, H];
    row e is expert `first + e`.

    Expert parallelism keeps a slice of the rows (`keep`); Hugging Face names, one tensor per
    expert and projection (Mixtral's `experts.j.w1`), come from hf_names.py at the format
    boundary.
    """

    WEIGHTS = ("w13", "w2")

    def __init__(self, n_experts: int, dim: int, hidden_dim: int):
        super().__init__()
        self.first = 0  # global id of row 0 (expert parallelism holds a slice)
        self.w13 = nn.Parameter(torch.empty(n_experts, 2 * hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))
        if not self.w13.is_meta:  # drawn again by the model's init_weights, with its depth's std
            self.init_weights(init_std=0.02)

    def __len__(self) -> int:
        return self.w13.shape[0]

    @property
    def ids(self) -> range:
        """Global ids of the experts held here."""
        return range(self.first, self.first + len(self))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Expert e on the next counts[e] rows of x (rows grouped by expert)."""
        return grouped_swiglu(self.w13, self.w2, x, counts)

    def keep(self, ids: range) -> None:
        """Hold only the experts `ids` (global, a slice of the ones held now)."""
        rows = slice(ids.start - self.first, ids.stop - self.first)
        for name in self.WEIGHTS:
            weight = getattr(self, name)
            setattr(self, name, nn.Parameter(weight.detach()[rows].clone(), weight.requires_grad))
        self.first = ids.start

    def init_weights(self, init_std: float) -> None:
        """w13 (gate, up) from N(0, 0.02); w2 (it writes into the residual stream) from
        N(0, init_std)."""
        nn.init.normal_(self.w13, mean=0.0, std=0.02)
        nn.init.normal_(self.w2, mean=0.0, std=init_std)


class MoE(nn.Module):
    """Top-k routed experts. forward(x [B, S, D]) -> [B, S, D]; sets `self.aux_loss`.

    Routing follows Mixtral: softmax over all router logits, keep the top k, renormalise them
    (equivalently, softmax over the top-k logits); without `norm_topk_prob` the kept
    probabilities weigh the experts as they are (Qwen3-MoE's switch). With `capacity_factor`
    set, each expert takes at most ceil(capacity_factor * tokens * top_k / n_experts)
    assignments; top-1 choices get priority over top-2 and so on, then token order (GShard);
    dropped assignments contribute nothing (the residual connection carries the token).
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        n_experts: int,
        top_k: int,
        capacity_factor: float | None = None,
        *,
        norm_topk_prob: bool = True,
    ):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        self.dim = dim
        self.n_experts = n_experts
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = GroupedExperts(n_experts, dim, hidden_dim)
        self.aux_loss: torch.Tensor = torch.zeros(())
        # Sums per-expert statistics over every rank holding part of the same sequences
        # (context parallelism); None when this rank sees whole sequences.
        self.reduce_stats: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.dim)
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E], fp32 like Mixtral
        top_p, top_idx = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_p = top_p / top_p.sum(dim=-1, keepdim=True)
        top_w = top_p.to(x.dtype)
        self.aux_loss = self.load_balancing_loss(probs, top_idx)

        token_idx, weight, counts = self.assign(top_idx, top_w)
        y = self.run_experts(x[token_idx], counts)  # rows grouped by expert id
        out = torch.zeros_like(x).index_add_(0, token_idx, (y * weight.unsqueeze(-1)).to(x.dtype))
        return out.reshape(shape)

    def init_weights(self, init_std: float) -> None:
        nn.init.normal_(self.gate.weight, mean=0.0, std=0.02)
        self.experts.init_weights(init_std)

    def __getstate__(self):
        # aux_loss is a graph tensor after a forward; copies and pickles keep its value only.
        state = dict(super().__getstate__())
        state["aux_loss"] = state["aux_loss"].detach()
        return state

    def load_balancing_loss(self, probs: torch.Tensor, top_idx: torch.Tensor) -> torch.Tensor:
        """Switch/Mixtral loss: E * sum_e (fraction of assignments to e) * (mean router prob of e).

        Same value as Hugging Face's `load_balancing_loss_func` (equals top_k when balanced).
        """
        n_tokens = probs.new_tensor(float(probs.shape[0]))
        assigned = torch.zeros(self.n_experts, device=probs.device, dtype=probs.dtype)
        assigned = assigned.index_add_(
            0, top_idx.reshape(-1), torch.ones_like(top_idx.reshape(-1), dtype=probs.dtype)
        )
        stats = torch.cat([assigned, probs.sum(dim=0), n_tokens.reshape(1)])
        if self.reduce_stats is not None:
            stats = self.reduce_stats(stats)
        assigned, prob_sum, n_tokens = stats.split([self.n_experts, self.n_experts, 1])
        # The assignment counts carry no gradient (as in Switch); only the router probs do.
        fraction = (assigned / n_tokens).detach()
        return self.n_experts * (fraction * prob_sum / n_tokens).sum()

    def assign(
        self, top_idx: torch.Tensor, top_w: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sort (token, expert) assignments by expert and apply the capacity.

        Returns token index and routing weight per kept assignment (grouped by expert) and the
        number of kept assignments per expert [E].
        """
        n_tokens, k = top_idx.shape
        # Slot-major order: every token's top-1 choice precedes any top-2 choice.
        expert = top_idx.t().reshape(-1)
        token = torch.arange(n_tokens, device=top_idx.device).repeat(k)
        weight = top_w.t().reshape(-1)
        order = torch.argsort(expert, stable=True)
        # index_add_, not bincount: bincount reads its maximum back to the host on CUDA.
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=expert.device)
        counts = counts.index_add_(0, expert, torch.ones_like(expert))
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * n_tokens * k / self.n_experts)
            starts = torch.cumsum(counts, 0) - counts
            rank_in_expert = (
                torch.arange(order.numel(), device=order.device) - starts[expert[order]]
            )
            counts = counts.clamp(max=capacity)
            n_kept = int(counts.sum())  # the layer's one host sync: the kept rows' number
            # Dropped assignments sort last (stable: kept ones stay grouped by expert).
            order = order[torch.argsort((rank_in_expert >= capacity).byte(), stable=True)[:n_kept]]
        return token[order], weight[order], counts

    def run_experts(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Apply expert e to the next counts[e] rows of x (rows grouped by expert id)."""
        return self.experts(x, counts)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype expert GEMMs run in: autocast's when it is on, else the activations'."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def grouped_mm_usable(device: torch.device, dtype: torch.dtype, *widths: int) -> bool:
    """Whether torch._grouped_mm takes these operands: it exists, every row stride is a
    multiple of 16 bytes, and the dtype is one the device's kernel has (CUDA: bf16, sm90+)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda" and (
        dtype != torch.bfloat16 or torch.cuda.get_device_capability(device) < (9, 0)
    ):
        return False  # the CUDA kernel is bf16 on Hopper and newer (H100, H200, B200)
    if device.type not in ("cpu", "cuda"):
        return False
    size = torch.empty((), dtype=dtype).element_size()
    return all(w * size % 16 == 0 for w in widths)


def grouped_swiglu(
    w13: torch.Tensor,
    w2: torch.Tensor,
    x: torch.Tensor,
    counts: torch.Tensor,
    use_grouped: bool | None = None,
) -> torch.Tensor:
    """SwiGLU of expert e (gate and up rows w13[e], down w2[e]) on the next counts[e] rows of x.

    Runs in the compute dtype: weights already in it (fp32 runs, FSDP2's param_dtype) are used
    as they are; others are cast (autograd-tracked: fp32 master copies receive fp32 gradients,
    as under FSDP2's mixed precision). No stacking: the 3-D weights are the GEMMs' operands.
    """
    dtype = compute_dtype(x)
    x = x.to(dtype)
    w13, w2 = w13.to(dtype), w2.to(dtype)  # no-ops when already in dtype
    dim, hidden = w2.shape[1:]
    if use_grouped is None:
        use_grouped = grouped_mm_usable(x.device, dtype, dim, hidden)
    if not use_grouped:
        chunks = x.split(counts.tolist(), dim=0)  # one host sync
        outs = []
        for e, chunk in enumerate(chunks):
            gate, up = F.linear(chunk, w13[e]).chunk(2, dim=-1)
            outs.append(F.linear(F.silu(gate) * up, w2[e]))
        return torch.cat(outs)
    offsets = torch.cumsum(counts, 0).to(torch.int32)  # stays on the device: no host sync
    gate, up = torch._grouped_mm(x, w13.transpose(1, 2), offs=offsets).chunk(2, dim=-1)
    h = (F.silu(gate) * up).contiguous()
    return torch._grouped_mm(h, w2.transpose(1, 2), offs=offsets)


def moe_aux_loss(model: nn.Module) -> torch.Tensor:
    """Sum of the load-balancing losses of every MoE layer from the last forward (0 if none)."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, MoE)]
    if not losses:
        return torch.zeros(())
    return torch.stack([loss.float() for loss in losses]).sum()
