"""Ring attention with each block on a fused attention kernel that returns its log-sum-exp
(aten's CPU flash op; on CUDA aten's flash or memory-efficient op, chosen per block by
`block_kernel`), K/V sent in the compute dtype. The ring, chunk plan and merge are
kiln/training/parallel/ring.py's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.training.parallel.ring import (
    DKV_TAG,
    KV_TAG,
    Block,
    Ring,
    local_chunks,
    merge_partial,
    plan_blocks,
    wait_all,
)

# Block kernels returning their log-sum-exp: aten's CPU flash op (takes a mask), and on CUDA the
# flash op (fp16/bf16, sm80+, no mask: unmasked blocks) and the memory-efficient op (any of
# fp32/fp16/bf16, sm50+, an additive bias: masked blocks and fp32).
CPU_FLASH, FLASH, EFFICIENT = "cpu_flash", "flash", "efficient"


def block_kernel(
    device_type: str, dtype: torch.dtype, masked: bool, capability: tuple[int, int] | None = None
) -> str | None:
    """The fused kernel one ring block runs on, or None where none returns the log-sum-exp
    (the caller then takes the fp32 matmul ring). `capability`: the CUDA device's (major, minor)."""
    if device_type == "cpu":
        return CPU_FLASH
    if device_type != "cuda" or capability is None:
        return None
    half = dtype in (torch.float16, torch.bfloat16)
    if not masked and half and capability >= (8, 0) and torch.backends.cuda.flash_sdp_enabled():
        return FLASH
    if capability >= (5, 0) and torch.backends.cuda.mem_efficient_sdp_enabled():
        return EFFICIENT
    return None


def _capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def _device_type(device: torch.device) -> str:
    return device.type  # a test runs the CUDA kernels' meta implementations as "cuda"


def _kernel_for(device: torch.device, dtype: torch.dtype, masked: bool) -> str | None:
    return block_kernel(_device_type(device), dtype, masked, _capability(device))


def fused_kernel_available(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether every ring block (masked ones included) has a fused kernel on this device."""
    return _kernel_for(device, dtype, True) is not None


def _bias(block: Block, dtype: torch.dtype, align: int = 1) -> torch.Tensor | None:
    """The block's mask as the additive bias the fused kernels take (in the compute dtype); rows
    padded to `align` elements in memory (the efficient kernel's requirement), sliced back."""
    if block.mask is None:
        return None
    sq, sk = block.mask.shape
    padded = -(-sk // align) * align
    bias = torch.zeros(sq, padded, dtype=dtype, device=block.mask.device)[:, :sk]
    return bias.masked_fill_(~block.mask, float("-inf"))


@dataclass
class _Saved:
    """What one block's forward hands its backward: the kernel and its own extra outputs
    (flash: cumulative lengths, max lengths, RNG state; efficient: RNG state)."""

    kernel: str
    extra: tuple = ()


def _fused_forward(q, k, v, block: Block, scale: float, groups: int):
    """One block on a fused kernel: (out [B, Hq, Sq, D] in q's dtype, lse [B, Hq, Sq] fp32,
    _Saved). K/V heads are repeated for the block only (the kernels have no GQA form)."""
    qb = q[:, :, block.q]
    kb = k[:, :, block.k].repeat_interleave(groups, dim=1)
    vb = v[:, :, block.k].repeat_interleave(groups, dim=1)
    kernel = _kernel_for(q.device, q.dtype, block.mask is not None)
    if kernel == CPU_FLASH:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qb, kb, vb, 0.0, False, attn_mask=_bias(block, q.dtype), scale=scale
        )
        saved = _Saved(kernel)
    elif kernel == FLASH:
        out, lse, *extra = torch.ops.aten._scaled_dot_product_flash_attention(
            qb, kb, vb, 0.0, False, False, scale=scale
        )
        saved = _Saved(kernel, tuple(extra[:6]))  # cum_q, cum_k, max_q, max_k, seed, offset
    elif kernel == EFFICIENT:
        bias = _bias(block, q.dtype, align=16)
        if bias is not None:
            bias = bias.expand(qb.shape[0], qb.shape[1], *bias.shape)
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            qb, kb, vb, bias, True, 0.0, False, scale=scale
        )
        lse = lse[:, :, : qb.shape[2]]  # the kernel pads the rows to a multiple of 32
        saved = _Saved(kernel, (seed, offset))
    else:
        raise RuntimeError(f"no fused attention kernel for {q.device} {q.dtype}")
    if block.mask is not None:  # rows with no visible key: lse -inf (kernels give 0 or NaN)
        hidden = ~block.mask.any(-1)
        lse = lse.masked_fill(hidden, float("-inf"))
        out = out.masked_fill(hidden[:, None], 0.0)
    return out, lse, saved


def _seq_major(t: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] seen over [B, S, H, D] memory (a copy unless it already is)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _fused_backward(dout, q, k, v, out, lse, block: Block, scale, groups, saved: _Saved):
    """dq, dk, dv of one block from the final output and log-sum-exp (flash-style backward)."""
    rows = block.q
    qb, do, ob, lb = q[:, :, rows], dout[:, :, rows], out[:, :, rows], lse[:, :, rows]
    kb = k[:, :, block.k].repeat_interleave(groups, dim=1)
    vb = v[:, :, block.k].repeat_interleave(groups, dim=1)
    if saved.kernel == CPU_FLASH:
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do, qb, kb, vb, ob, lb, 0.0, False, attn_mask=_bias(block, q.dtype), scale=scale
        )
    elif saved.kernel == FLASH:
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            do,
            qb,
            kb,
            vb,
            ob,
            lb.contiguous(),
            *saved.extra[:4],
            0.0,
            False,
            *saved.extra[4:],
            scale=scale,
        )
    else:
        bias = _bias(block, q.dtype, align=16)
        if bias is not None:
            bias = bias.expand(qb.shape[0], qb.shape[1], *bias.shape)
        # The kernel reads the output and its gradient in the layout its forward writes
        # ([B, S, H, D] memory): handed [B, H, S, D] memory, bf16 dq/dk came back wrong or NaN
        # on an H200 (torch 2.11; dv and fp32 were right).
        ob, do = _seq_major(ob), _seq_major(do)
        padded = -(-lb.shape[2] // 32) * 32  # the kernel reads its own padded layout
        lse_in = lb.new_zeros(*lb.shape[:2], padded)
        lse_in[:, :, : lb.shape[2]] = lb
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            do,
            qb,
            kb,
            vb,
            bias,
            ob,
            lse_in,
            *saved.extra,
            0.0,
            [True, True, True, False],
            False,
            scale=scale,
        )
    B, _, Sk, D = dk.shape
    fold = (B, dk.shape[1] // groups, groups, Sk, D)
    return dq, dk.reshape(fold).sum(2), dv.reshape(fold).sum(2)


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
        ring = Ring(group)
        _check_shapes(q, k, zigzag)
        B, Hq, S, D = q.shape
        groups, scale = Hq // k.shape[1], D**-0.5
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros(B, Hq, S, D, dtype=torch.float32, device=q.device)
        lse = torch.full((B, Hq, S), float("-inf"), device=q.device)
        q_chunks = local_chunks(S, ring.rank, ring.world, zigzag)
        plans = []
        for step in range(ring.world):
            if step < ring.world - 1:
                next_kv, works = ring.shift(kv, KV_TAG)  # overlaps with this step's compute
            src = (ring.rank - step) % ring.world
            plan = plan_blocks(
                q_chunks, local_chunks(S, src, ring.world, zigzag), causal, window, q.device
            )
            kernels = []
            for block in plan:
                out_b, lse_b, saved = _fused_forward(q, kv[0], kv[1], block, scale, groups)
                kernels.append(saved)
                rows = block.q
                out[:, :, rows], lse[:, :, rows] = merge_partial(
                    out[:, :, rows], lse[:, :, rows], out_b.float(), lse_b
                )
            plans.append(list(zip(plan, kernels, strict=True)))
            if step < ring.world - 1:
                wait_all(works)
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
                next_kv, works = ring.shift(kv, KV_TAG)
            for block, saved in ctx.plans[step]:
                dq_b, dk_b, dv_b = _fused_backward(
                    dout, q, kv[0], kv[1], out, lse, block, scale, groups, saved
                )
                dq[:, :, block.q] += dq_b
                dkv[0][:, :, block.k] += dk_b
                dkv[1][:, :, block.k] += dv_b
            if ring.world > 1:
                dkv, dkv_works = ring.shift(dkv, DKV_TAG)  # after the last step it is back home
                wait_all(dkv_works)
            if step < ring.world - 1:
                wait_all(works)
                kv = next_kv
        grads = dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
        return (*grads, None, None, None, None)
