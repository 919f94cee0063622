"""Tensor + sequence parallelism with DTensor (Megatron's layout, torchtitan's plan).

Norms and residuals run on sequence shards (Shard(1)); attention and feed-forward all-gather
the sequence, split heads / hidden units column-wise, and reduce-scatter back row-wise.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from kiln.model.fused_projections import fused_modules, use_shard_blocks
from kiln.platform.errors import ConfigError
from kiln.training.parallel.mla_tensor_parallel import mla_attention_plan, sum_shared_key_grads


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Shard every block over `tp_mesh` with sequence parallelism between them (in place)."""
    cfg = model.cfg
    tp = tp_mesh.size()
    if cfg.n_heads % tp or cfg.n_kv_heads % tp:
        raise ConfigError(
            f"parallel.tp={tp} must divide model.n_heads ({cfg.n_heads}) "
            f"and n_kv_heads ({cfg.n_kv_heads})"
        )
    _check_fused_rows(model, tp)
    use_shard_blocks(model, tp)  # fused [q; k; v] rows as per-rank blocks [q_r; k_r; v_r]
    parallelize_module(model, tp_mesh, _top_plan(model, loss_parallel))
    if cfg.tie_embeddings and model.output is not None:
        model.output.weight = model.tok_embeddings.weight  # both are vocab-sharded: Shard(0)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _block_plan(block))
        if cfg.mla is not None:
            sum_shared_key_grads(block.attention, tp_mesh)


def _check_fused_rows(model: nn.Module, tp: int) -> None:
    """Each rank's block of a fused Linear holds 1/tp of every part: each part's rows divide
    (heads do, by the check above; a feed-forward's hidden units may not)."""
    for name, module in fused_modules(model).items():
        fusion = module.fusion
        if any(size % tp for size in fusion.sizes):
            raise ConfigError(
                f"parallel.tp={tp} must divide the rows of {name}'s "
                f"{'/'.join(fusion.parts)} ({', '.join(map(str, fusion.sizes))}) with "
                "model.fused_projections; set it to false or pick another tp"
            )


def _top_plan(model: nn.Module, loss_parallel: bool) -> dict:
    """Embeddings row-wise into sequence shards, the final norm on them, the head column-wise
    (its output stays vocab-sharded under loss parallelism)."""
    plan = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return plan


def _block_plan(block: nn.Module) -> dict:
    """Norms on sequence shards; attention and the feed-forward gather the sequence, split
    heads / hidden units column-wise and reduce-scatter back row-wise."""
    plan = {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()}
    if hasattr(block.attention, "wkv_a"):  # Multi-head Latent Attention
        plan.update(mla_attention_plan(block.attention))
    else:
        plan.update(_attention_plan(block.attention))
    for norm in ("post_attention_norm", "post_ffn_norm"):  # sandwich norms, on sequence shards
        if getattr(block, norm) is not None:
            plan[norm] = SequenceParallel(use_local_output=True)
    if block.shared_experts is not None:  # a dense SwiGLU beside the experts: split as one
        plan.update(_feed_forward_plan("shared_experts", block.shared_experts))
    if block.moe_enabled:
        # Experts stay whole on every TP rank (expert parallelism splits them instead).
        plan["moe"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),),
            use_local_output=True,
        )
        return plan
    plan.update(_feed_forward_plan("feed_forward", block.feed_forward))
    return plan


def _attention_plan(attention: nn.Module) -> dict:
    """GQA: q/k/v split by heads on the gathered sequence, wo back to sequence shards. A fused
    wqkv splits the same way: its rows are per-rank blocks (use_shard_blocks)."""
    plan = {
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None, None),
            desired_input_layouts=(Replicate(), None, None),
        ),
    }
    for linear in ("wqkv",) if hasattr(attention, "wqkv") else ("wq", "wk", "wv"):
        plan[f"attention.{linear}"] = ColwiseParallel()
    plan["attention.wo"] = RowwiseParallel(output_layouts=Shard(1))
    if attention.q_norm is not None:
        # qk-norm's weight is shared by every head: replicated, over this rank's heads (dim 2 of
        # [B, S, H, Dh]), so its gradient sums over the TP ranks' heads.
        for norm in ("attention.q_norm", "attention.k_norm"):
            plan[norm] = SequenceParallel(sequence_dim=2, use_local_output=True)
    return plan


def _feed_forward_plan(name: str, ffn: nn.Module) -> dict:
    """A gated FFN on the gathered sequence: w1/w3 (or a fused w13 of per-rank [gate_r; up_r]
    blocks) column-wise, w2 row-wise back to shards."""
    plan = {
        name: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    }
    for linear in ("w13",) if hasattr(ffn, "w13") else ("w1", "w3"):
        plan[f"{name}.{linear}"] = ColwiseParallel()
    plan[f"{name}.w2"] = RowwiseParallel(output_layouts=Shard(1))
    return plan
