"""Rank function: kiln's Trainer for a few steps under given layouts (fp32, synthetic batches)."""

from __future__ import annotations

import torch

from kiln.training.config import TrainConfig

STEPS = 3  # the 3rd step's loss is the loss after 2 optimizer steps

# The new architectures' switches on the tiny shape (2 layers; Gemma's window pattern 2 so both
# kinds of layer are there)
LLAMA32 = {
    "rope_theta": 500_000.0,
    "rope_scaling": {"factor": 32.0, "original_max_seq_len": 8},  # short: every band reached
    "tie_embeddings": True,
}
QWEN3 = {"qk_norm": True, "head_dim": 32}
QWEN3_MOE = {**QWEN3, "n_experts": 4, "top_k": 2, "norm_topk_prob": False}
GEMMA3 = {
    **QWEN3,
    "norm_unit_offset": True,
    "sandwich_norm": True,
    "embed_scale": True,
    "ffn_activation": "gelu_tanh",
    "tie_embeddings": True,
    "sliding_window": 8,
    "sliding_window_pattern": 2,
    "rope_local_theta": 100.0,
    "query_pre_attn_scalar": 24.0,
    "final_logit_softcap": 3.0,
}

# DeepSeek-V3's switches on the tiny shape: MLA with YaRN, a dense first layer, the sigmoid
# grouped router with its balancing bias, a shared expert
MLA = {
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
}
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_seq_len": 16,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
DEEPSEEK = {
    "n_experts": 4,
    "top_k": 2,
    "moe_hidden_dim": 32,
    "n_shared_experts": 1,
    "first_dense_layers": 1,
    "router_score": "sigmoid",
    "n_expert_groups": 2,
    "topk_groups": 1,
    "routed_scaling_factor": 2.5,
    # large enough that a bias update from one rank's loads alone would route differently
    "router_bias_update_rate": 0.05,
    "moe_aux_loss_coef": 0.0,  # aux-loss-free, as imports set it (and pp adds no aux loss)
    "mla": MLA,
    "rope_scaling": YARN,
}


def train_config(
    parallel: dict, model: dict, optimizer: dict | None = None, checkpoint: dict | None = None
) -> TrainConfig:
    return TrainConfig(
        model={"preset": "tiny", "n_layers": 2, **model},
        parallel=parallel,
        seq_len=32,
        global_batch_size=4,
        micro_batch_size=2,
        steps=STEPS,
        seed=7,
        device="cpu",
        precision="fp32",
        optimizer={"lr": 3e-3, **(optimizer or {})},
        data={"synthetic": True, "prefetch": 0},
        checkpoint=checkpoint or {},
    )


def train_losses(layouts: list[tuple[dict, dict, dict]]) -> list[list[float]]:
    """Per-step losses of one run per (parallel, model, optimizer) layout, one after the other.

    Several layouts share one process group: worker start-up (importing torch's distributed
    stack) costs more than these tiny runs.
    """
    from kiln.training.trainer import Trainer

    results = []
    for parallel, model, optimizer in layouts:
        torch.manual_seed(0)
        history = Trainer(train_config(parallel, model, optimizer)).train()
        results.append([m["loss"] for m in history])
    return results
