"""Context parallelism: split each sequence over the `cp` mesh dim and attend with ring attention.

Rank r of the cp group holds zig-zag chunks r and 2*cp-1-r of every sequence (tokens, labels,
activations). Everything except attention is per-token, so only three things change:
  * each `attention.core` becomes a `RingAttentionCore` (same causal / sliding-window settings),
  * the model's forward gets `positions=` the rank's global positions (RoPE rows),
  * MoE load-balancing statistics are summed over the cp group (they describe whole sequences).

Loss and gradients (the trainer's part): each cp rank computes the mean cross entropy over its
own tokens. Every cp rank holds the same number of tokens, so the mean of the cp ranks' losses is
the loss of the whole sequence; gradients must therefore be *averaged* over the cp group, which
FSDP/replicate does when its mesh includes the cp dim (torchtitan's `dp_shard_cp`: shard or
replicate over the flattened (dp_shard, cp) dims). For logging, all-reduce the loss with AVG over
dp and cp. With ignored labels (-100) the token counts differ per rank: reduce sum(loss) and
count(tokens) separately instead.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from kiln.model.moe import MoE
from kiln.platform.errors import ConfigError
from kiln.training.parallel.ring import local_positions, zigzag_shard
from kiln.training.parallel.ring_attention import ring_attention

log = logging.getLogger("kiln.training")


class RingAttentionCore(nn.Module):
    """Drop-in attention core: q [B, Hq, S/cp, Dh], k/v [B, Hkv, S/cp, Dh] on zig-zag shards."""

    def __init__(self, group: dist.ProcessGroup, sliding_window: int | None, causal: bool = True):
        super().__init__()
        self.group = group
        self.sliding_window = sliding_window
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(
            q, k, v, self.group, causal=self.causal, window=self.sliding_window, zigzag=True
        )

    def extra_repr(self) -> str:
        return f"cp={dist.get_world_size(self.group)}, sliding_window={self.sliding_window}"


def _sum_over(group: dist.ProcessGroup):
    """Differentiable all-reduce SUM (its backward sums the gradients over the group too)."""
    from torch.distributed.nn.functional import all_reduce

    return lambda t: all_reduce(t, op=dist.ReduceOp.SUM, group=group)


def apply_context_parallel(
    model: nn.Module, cp_mesh: DeviceMesh, seq_len: int | None = None
) -> nn.Module:
    """Swap attention cores for ring attention and feed RoPE this rank's positions (in place).

    `seq_len` is the global training sequence length (default: the rope table's length, i.e.
    max_seq_len); batches must then be `seq_len` tokens long, sharded by
    `shard_for_context_parallel`.
    """

    group = cp_mesh.get_group()
    cp, rank = cp_mesh.size(), cp_mesh.get_local_rank()
    seq_len = seq_len or model.cfg.max_seq_len
    if seq_len is None or seq_len % (2 * cp):
        raise ConfigError(
            f"seq_len={seq_len} must be a multiple of 2*cp = {2 * cp} for context parallelism"
        )
    positions = local_positions(seq_len // cp, rank, cp, zigzag=True)

    backend = getattr(getattr(model, "cfg", None), "attention_backend", "auto")
    if backend in ("flash_attn", "te"):
        log.warning(
            "model.attention_backend=%s is not used under parallel.cp > 1: ring attention runs "
            "each block on aten's fused attention kernel (docs/parallelism.md)",
            backend,
        )
    for name, module in model.named_modules():
        if name.endswith("attention") and hasattr(module, "core"):
            old = module.core
            module.core = RingAttentionCore(
                group, getattr(old, "sliding_window", None), getattr(old, "causal", True)
            )
        if isinstance(module, MoE):
            module.reduce_stats = _sum_over(group)

    _pass_positions(model, positions)
    return model


def _pass_positions(model: nn.Module, positions: torch.Tensor) -> None:
    """Every forward of this model (part) gets `positions=` the local tokens' global positions."""
    on_device: dict[torch.device, torch.Tensor] = {}

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        if kwargs.get("positions") is None:
            device = module.rope_cos.device
            if device not in on_device:
                on_device[device] = positions.to(device)
            kwargs["positions"] = on_device[device]
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)


def shard_for_context_parallel(
    tokens: torch.Tensor, labels: torch.Tensor, cp_mesh: DeviceMesh
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's zig-zag part of a [B, S] batch: chunks r and 2*cp-1-r of 2*cp along S."""
    cp, rank = cp_mesh.size(), cp_mesh.get_local_rank()
    if tokens.shape[1] % (2 * cp):
        raise ConfigError(
            f"seq_len={tokens.shape[1]} must be a multiple of 2*cp = {2 * cp} "
            "for context parallelism"
        )
    return zigzag_shard(tokens, 1, rank, cp), zigzag_shard(labels, 1, rank, cp)
