"""Ring attention with each block on aten's fused flash kernel (which returns the log-sum-exp),
K/V sent in the compute dtype. The ring, chunk plan and merge are ring_attention.py's."""

from __future__ import annotations

import torch

from kiln.training.parallel.ring_attention import (
    _DKV_TAG,
    _KV_TAG,
    _Block,
    _chunks,
    _merge,
    _plan,
    _Ring,
    _wait,
)


def fused_kernel_available(device: torch.device) -> bool:
    """Whether ring blocks run on a fused attention kernel that returns its log-sum-exp here."""
    return device.type == "cpu"


def _bias(block: _Block, dtype: torch.dtype) -> torch.Tensor | None:
    """The block's mask as the additive bias the fused kernel takes (in the compute dtype)."""
    if block.mask is None:
        return None
    return torch.zeros(block.mask.shape, dtype=dtype, device=block.mask.device).masked_fill_(
        ~block.mask, float("-inf")
    )


def _fused_forward(q, k, v, block: _Block, scale: float, groups: int):
    """One block on aten's flash kernel: (out [B, Hq, Sq, D] in q's dtype, lse [B, Hq, Sq] fp32).
    K/V heads are repeated for the block only (the kernel has no GQA form)."""
    qb = q[:, :, block.q]
    kb = k[:, :, block.k].repeat_interleave(groups, dim=1)
    vb = v[:, :, block.k].repeat_interleave(groups, dim=1)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qb, kb, vb, 0.0, False, attn_mask=_bias(block, q.dtype), scale=scale
    )
    if block.mask is not None:  # the kernel gives rows with no visible key lse 0, not -inf
        lse = lse.masked_fill(~block.mask.any(-1), float("-inf"))
    return out, lse


def _fused_backward(dout, q, k, v, out, lse, block: _Block, scale: float, groups: int):
    """dq, dk, dv of one block from the final output and log-sum-exp (flash backward)."""
    rows = block.q
    kb = k[:, :, block.k].repeat_interleave(groups, dim=1)
    vb = v[:, :, block.k].repeat_interleave(groups, dim=1)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout[:, :, rows],
        q[:, :, rows],
        kb,
        vb,
        out[:, :, rows],
        lse[:, :, rows],
        0.0,
        False,
        attn_mask=_bias(block, q.dtype),
        scale=scale,
    )
    B, _, Sk, D = dk.shape
    fold = (B, dk.shape[1] // groups, groups, Sk, D)
    return dq, dk.view(fold).sum(2), dv.view(fold).sum(2)


def _check_shapes(q, k, zigzag: bool) -> None:
    Hq, Hkv, S = q.shape[1], k.shape[1], q.shape[2]
    if Hq % Hkv:
        raise ValueError(f"query heads {Hq} must be a multiple of key/value heads {Hkv}")
    if zigzag and S % 2:
        raise ValueError(f"zig-zag ring attention needs an even local length, got {S}")


class FusedRingAttention(torch.autograd.Function):
    """Ring attention whose blocks run on a fused kernel; K/V travel in the compute dtype and
    only the output, its fp32 log-sum-exp and the inputs are saved for backward."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, window, zigzag):
        ring = _Ring(group)
        _check_shapes(q, k, zigzag)
        B, Hq, S, D = q.shape
        groups, scale = Hq // k.shape[1], D**-0.5
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros(B, Hq, S, D, dtype=torch.float32, device=q.device)
        lse = torch.full((B, Hq, S), float("-inf"), device=q.device)
        q_chunks = _chunks(S, ring.rank, ring.world, zigzag)
        plans = []
        for step in range(ring.world):
            if step < ring.world - 1:
                next_kv, works = ring.shift(kv, _KV_TAG)  # overlaps with this step's compute
            src = (ring.rank - step) % ring.world
            plan = _plan(q_chunks, _chunks(S, src, ring.world, zigzag), causal, window, q.device)
            for block in plan:
                out_b, lse_b = _fused_forward(q, kv[0], kv[1], block, scale, groups)
                rows = block.q
                out[:, :, rows], lse[:, :, rows] = _merge(
                    out[:, :, rows], lse[:, :, rows], out_b.float(), lse_b
                )
            plans.append(plan)
            if step < ring.world - 1:
                _wait(works)
                kv = next_kv
        out = out.to(q.dtype)
        ctx.ring, ctx.plans, ctx.scale, ctx.groups = ring, plans, scale, groups
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale, groups = ctx.ring, ctx.scale, ctx.groups
        dout = dout.contiguous()
        kv = torch.stack([k, v]).contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        # fp32 accumulator of the block currently held; it travels with the block
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        for step in range(ring.world):
            if step < ring.world - 1:
                next_kv, works = ring.shift(kv, _KV_TAG)
            for block in ctx.plans[step]:
                dq_b, dk_b, dv_b = _fused_backward(
                    dout, q, kv[0], kv[1], out, lse, block, scale, groups
                )
                dq[:, :, block.q] += dq_b
                dkv[0][:, :, block.k] += dk_b
                dkv[1][:, :, block.k] += dv_b
            if ring.world > 1:
                dkv, dkv_works = ring.shift(dkv, _DKV_TAG)  # after the last step it is back home
                _wait(dkv_works)
            if step < ring.world - 1:
                _wait(works)
                kv = next_kv
        grads = dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
        return (*grads, None, None, None, None)
