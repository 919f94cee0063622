"""Recompute (activation checkpointing) per transformer block (activation offload:
activation_offload.py)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# Activation offload lives in its own module; parallelize imports it from here.
from kiln.training.parallel.activation_offload import (  # noqa: F401
    apply_activation_offload,
    worth_offloading,
)
from kiln.training.parallel.ring import inside_ring_blocks

# Op-level selective recompute keeps the expensive outputs (matmuls, attention, collectives) and
# recomputes the cheap element-wise work (norms, RoPE, SiLU) in the backward pass.
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    # fp8 (torchao's Float8Linear), as torchtitan keeps them: eager, a policy sees its GEMMs as
    # aten.mm on float8 tensors (kept above); a compiled graph has them as _scaled_mm, beside the
    # amax each scale comes from (a scalar, kept so recompute reuses the forward's scale)
    torch.ops.aten._scaled_mm.default,
    torch.ops.aten.max.default,
}
# Attention kernels of optional packages, saved when the package registered them as torch ops
# (flash-attn >= 2.6 does; Transformer Engine's fused attention is not a dispatcher op, so a
# policy cannot see it: under selective recompute TE attention is recomputed).
_OPTIONAL_SAVE_OPS = {
    "flash_attn": ("_flash_attn_forward", "_flash_attn_varlen_forward"),
}
# Matmuls inside ring attention's fp32 block path produce S/cp x S/cp score blocks: saving them
# would keep every block's scores, far more than the attention output they replace.
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.matmul.default}


def save_ops() -> set:
    """The ops whose outputs op-level selective recompute keeps."""
    ops = set(_SAVE_OPS)
    for namespace, names in _OPTIONAL_SAVE_OPS.items():
        for name in names:
            packet = getattr(getattr(torch.ops, namespace), name, None)
            if packet is not None:
                ops.add(packet.default)
    return ops


def _op_policy_context():
    keep = save_ops()

    def policy(ctx, op, *args, **kwargs):
        if op in _MATMULS and inside_ring_blocks():
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_recompute(model: nn.Module, mode: str, selective: str = "op") -> None:
    """`full`: recompute each block; `selective`: op-level policy or just the attention core."""
    if mode == "none":
        return
    for key, block in list(model.layers.items()):
        if mode == "full":
            model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)
        elif selective == "attention":
            block.attention.core = checkpoint_wrapper(
                block.attention.core, preserve_rng_state=False
            )
        else:
            model.layers[key] = checkpoint_wrapper(
                block, preserve_rng_state=False, context_fn=_op_policy_context
            )
