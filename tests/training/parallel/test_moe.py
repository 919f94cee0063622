"""The MoE layer: Hugging Face Mixtral parity, load-balancing loss, capacity dropping."""

from __future__ import annotations

import copy

import torch

from kiln.model.moe import MoE, moe_aux_loss


def test_matches_hf_mixtral_block_and_aux_loss():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import (
        MixtralSparseMoeBlock,
        load_balancing_loss_func,
    )

    torch.manual_seed(0)
    cfg = MixtralConfig(
        hidden_size=16, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2
    )
    hf = MixtralSparseMoeBlock(cfg).eval()
    moe = MoE(16, 24, n_experts=4, top_k=2)
    with torch.no_grad():
        hf.gate.weight.copy_(moe.gate.weight)
        # HF's layout is kiln's: [gate; up] [E, 2H, D] and down [E, D, H]
        hf.experts.gate_up_proj.copy_(moe.experts.w13)
        hf.experts.down_proj.copy_(moe.experts.w2)
    x = torch.randn(2, 7, 16, requires_grad=True)
    out, ref = moe(x), hf(x)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    w = torch.randn_like(out)
    e = moe.experts
    grads = torch.autograd.grad((out * w).sum(), (x, e.w13, e.w2))
    hf_weights = (x, hf.experts.gate_up_proj, hf.experts.down_proj)
    ref_grads = torch.autograd.grad((ref * w).sum(), hf_weights)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    hf_aux = load_balancing_loss_func((moe.gate(x.view(-1, 16)),), num_experts=4, top_k=2)
    torch.testing.assert_close(moe.aux_loss, hf_aux)
    assert (
        moe_aux_loss(torch.nn.Sequential(moe, copy.deepcopy(moe))).item() == 2 * moe.aux_loss.item()
    )


def test_balanced_router_gives_aux_loss_top_k():
    moe = MoE(8, 16, n_experts=4, top_k=2)
    with torch.no_grad():
        moe.gate.weight.zero_()  # uniform probabilities; ties go to experts 0 and 1
    moe(torch.randn(1, 4, 8))
    # Assignment fractions (1, 1, 0, 0), router probs 1/4 each: 4 * (1/4 + 1/4) = top_k.
    assert abs(moe.aux_loss.item() - 2.0) < 1e-6


def test_capacity_drops_lowest_priority_assignments():
    torch.manual_seed(1)
    x = torch.randn(1, 32, 8)
    free = MoE(8, 16, n_experts=4, top_k=1)
    capped = copy.deepcopy(free)
    capped.capacity_factor = 0.5  # each expert takes at most ceil(0.5 * 32 / 4) = 4 tokens
    out_free, out_capped = free(x)[0], capped(x)[0]
    kept = (out_capped.abs().sum(-1) > 0).nonzero().flatten()
    assert len(kept) <= 4 * 4 and len(kept) < 32
    torch.testing.assert_close(out_capped[kept], out_free[kept])  # kept tokens are untouched
    # Priority by token order within an expert: the first tokens routed to an expert are kept.
    expert = free.gate(x[0]).argmax(-1)
    for e in range(4):
        routed = (expert == e).nonzero().flatten()
        assert set(routed[:4].tolist()) <= set(kept.tolist())
    assert torch.isfinite(capped.aux_loss)
