"""Rank functions: A's Transformer under context / expert parallelism vs one process (one step)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from kiln.model import ModelConfig, Transformer
from kiln.model.moe import GroupedExperts, moe_aux_loss
from kiln.training.parallel.activation_checkpoint import apply_recompute
from kiln.training.parallel.context_parallel import (
    apply_context_parallel,
    shard_for_context_parallel,
)
from kiln.training.parallel.expert_parallel import apply_expert_parallel

# (model overrides, recompute mode applied after CP as parallelize does)
CP_CASES = [
    ({}, "none"),  # GQA 4 query / 2 kv heads
    ({"n_kv_heads": 1, "sliding_window": 6}, "none"),  # MQA + sliding window
    ({"n_experts": 4, "top_k": 2, "moe_aux_loss_coef": 0.1}, "none"),  # MoE stats over cp
    ({"sliding_window": 10}, "selective"),  # op-level recompute replays the ring attention
    ({}, "full"),
]


def _objective(model, cfg, tokens, labels):
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    return loss + cfg.moe_aux_loss_coef * moe_aux_loss(model)


def _grad_error(model, ref) -> float:
    ref_params = dict(ref.named_parameters())
    # expert weights: the rows this rank holds (a slice under expert parallelism)
    rows = {
        f"{name}.{w}": list(module.ids)
        for name, module in model.named_modules()
        if isinstance(module, GroupedExperts)
        for w in ("w13", "w2")
    }
    errors = []
    for n, p in model.named_parameters():
        ref_grad = ref_params[n.replace("_checkpoint_wrapped_module.", "")].grad
        ref_grad = ref_grad[rows[n]] if n in rows else ref_grad
        errors.append((p.grad - ref_grad).abs().max().item())
    return max(errors)


def cp_model_vs_single(seq_len: int, cases: list[int]) -> list[tuple]:
    """Loss and grads of the cp-sharded model (loss and grads averaged over cp) vs one process."""
    _rank, cp = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    results = []
    for seed in cases:
        overrides, recompute = CP_CASES[seed]
        torch.manual_seed(seed)
        cfg = ModelConfig.preset("tiny", n_layers=1, **overrides)
        ref = Transformer(cfg)
        model = copy.deepcopy(ref)
        tokens = torch.randint(0, cfg.vocab_size, (2, seq_len))
        labels = torch.roll(tokens, -1, dims=1)
        ref_loss = _objective(ref, cfg, tokens, labels)
        ref_loss.backward()

        apply_context_parallel(model, mesh, seq_len=seq_len)
        apply_recompute(model, recompute, "op")
        local_tokens, local_labels = shard_for_context_parallel(tokens, labels, mesh)
        loss = _objective(model, cfg, local_tokens, local_labels)
        loss.backward()
        for p in model.parameters():  # FSDP over (dp_shard, cp) averages gradients like this
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        dist.all_reduce(loss := loss.detach().clone(), op=dist.ReduceOp.AVG)
        results.append(
            ((overrides, recompute), abs(loss.item() - ref_loss.item()), _grad_error(model, ref))
        )
    return results


def ep_model_vs_single() -> list[tuple[str, float, float]]:
    """MoE Transformer with experts over ep=world ranks, one micro-batch per rank, vs one process.

    Also under op-level selective recompute, which replays the all-to-alls.
    """
    rank, ep = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ep,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", n_layers=1, n_experts=4, top_k=2, moe_aux_loss_coef=0.1)
    ref = Transformer(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (ep, 2, 16))
    labels = torch.roll(tokens, -1, dims=2)
    results = []
    for recompute in ("none", "selective"):
        model = copy.deepcopy(ref)
        apply_expert_parallel(model, mesh)
        apply_recompute(model, recompute, "op")
        loss = _objective(model, cfg, tokens[rank], labels[rank])
        loss.backward()
        experts = {
            id(p) for m in model.modules() if hasattr(m, "ep_group") for p in m.experts.parameters()
        }
        for p in model.parameters():
            if id(p) not in experts:  # FSDP averages these; EP's hooks average expert grads
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        dist.all_reduce(loss := loss.detach().clone(), op=dist.ReduceOp.AVG)
        results.append((recompute, loss.item(), model))
    ref_loss = sum(_objective(ref, cfg, tokens[r], labels[r]) for r in range(ep)) / ep
    ref_loss.backward()
    return [
        (recompute, abs(loss - ref_loss.item()), _grad_error(model, ref))
        for recompute, loss, model in results
    ]
