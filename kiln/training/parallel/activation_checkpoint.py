"""Recompute (activation checkpointing) and activation offload, applied per transformer block."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

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
}


def _op_policy_context():
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

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


class _OffloadHooks:
    """Enter `save_on_cpu` for the duration of a module's forward (reentrant-safe per thread)."""

    def __init__(self, pin_memory: bool):
        self.pin_memory = pin_memory
        self.stack: dict[int, list] = defaultdict(list)

    def pre(self, module, args):
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory)
        ctx.__enter__()
        self.stack[id(module)].append(ctx)

    def post(self, module, args, output):
        self.stack[id(module)].pop().__exit__(None, None, None)


def apply_activation_offload(model: nn.Module) -> None:
    """Tensors saved for backward inside each block live in CPU memory until the backward pass."""
    hooks = _OffloadHooks(pin_memory=torch.cuda.is_available())
    for block in model.layers.values():
        block.register_forward_pre_hook(hooks.pre)
        block.register_forward_hook(hooks.post)
