"""No subnormal floats anywhere in a training step of kiln's MoE models from their own init.

Subnormals (0 < |x| < 1.18e-38 in fp32) make CPU arithmetic 10-100x slower unless the CPU
flushes them, so a source of them (a tiny-scaled init, an underflowing score or bias path) shows
up as a model that trains several times slower than its peer for no visible reason. Every
operator's result is scanned, forward, backward and the AdamW step, for DeepSeek-V3 (MLA, YaRN,
sigmoid grouped router, shared experts, a dense first layer) and Qwen3-MoE (softmax top-k with
norm_topk_prob, qk-norm) shapes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kiln.model.config import ModelConfig
from kiln.model.mla_config import MLAConfig
from kiln.model.moe import moe_aux_loss
from kiln.model.rope_scaling import RopeScaling
from kiln.model.transformer import Transformer

TINY = torch.finfo(torch.float32).tiny  # the smallest normal fp32
# Their results are uninitialised memory (garbage until written), not computed values.
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}

DEEPSEEK = {
    "mla": MLAConfig(
        kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12
    ),
    "rope_scaling": RopeScaling(
        rope_type="yarn", factor=8.0, original_max_seq_len=16, mscale=1.0, mscale_all_dim=1.0
    ),
    "n_experts": 8,
    "top_k": 2,
    "moe_hidden_dim": 32,
    "n_shared_experts": 1,
    "first_dense_layers": 1,
    "router_score": "sigmoid",
    "n_expert_groups": 2,
    "topk_groups": 1,
    "routed_scaling_factor": 2.5,
}
QWEN3_MOE = {"n_experts": 8, "top_k": 2, "moe_hidden_dim": 32, "qk_norm": True}


def _subnormals(t: torch.Tensor) -> int:
    if not t.is_floating_point() or t.numel() == 0:
        return 0
    return int(((t != 0) & (t.abs() < TINY)).sum())


class SubnormalScan(TorchDispatchMode):
    """Counts subnormal values in every operator's result, by operator name."""

    def __init__(self):
        super().__init__()
        self.found: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in ALLOCATIONS:
            n = sum(_subnormals(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            if n:
                name = str(func)
                self.found[name] = self.found.get(name, 0) + n
        return out


def _train_steps(model: Transformer, steps: int = 2) -> dict[str, int]:
    """Subnormals produced by `steps` training steps (forward, loss, backward, AdamW), by op;
    the parameters, gradients and optimizer state are all some operator's result."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(0)
    scan = SubnormalScan()
    for _ in range(steps):
        tokens = torch.randint(0, model.cfg.vocab_size, (2, 33), generator=g)
        with scan:
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            (loss + 0.01 * moe_aux_loss(model)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return scan.found


@pytest.mark.parametrize("shape", [DEEPSEEK, QWEN3_MOE], ids=["deepseek_v3", "qwen3_moe"])
def test_moe_training_step_makes_no_subnormals(shape):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", n_layers=3, max_seq_len=64, **shape))
    for name, p in model.named_parameters():
        assert _subnormals(p) == 0, f"{name} is initialised with subnormal values"
    assert _train_steps(model) == {}


def test_scan_finds_a_planted_subnormal():
    """The scan is not blind: one expert weight scaled into the subnormal range shows up."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", n_layers=2, max_seq_len=64, **QWEN3_MOE))
    with torch.no_grad():
        model.layers["1"].moe.experts.w2[0].mul_(1e-37)  # ~1e-39: subnormal
    found = _train_steps(model, steps=1)
    assert found and sum(found.values()) > 0
