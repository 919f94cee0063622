"""The gated FFN of a packed CPU model with its elementwise work inside the matmuls (oneDNN
post-ops).

`FeedForward` computes w2(silu(w1 x) * w3 x) as two matmuls, a silu, a multiply and three bf16
roundings between them: at a prefill step's 300+ rows the silu and the multiply cost a third of
the two matmuls again (bf16 elementwise ops on CPU are not vectorised as well as oneDNN's
epilogues). vLLM-CPU fuses them in its own kernel; here oneDNN does, as torch's inductor does
when it freezes a model: the gate matmul applies silu ("swish") to its fp32 accumulators before
rounding, and the up matmul multiplies by that gate ("mul" binary post-op) the same way. One
rounding each instead of three: within bf16 rounding of the plain path, not bit-equal. fp32
models packed for oneDNN (cpu_linear.fp32_linears_on_onednn) fuse the same way, for the passes
saved: equal to the plain path up to fp32 rounding.

`PackedSwiGLU` wraps a `FeedForward` whose w1/w3 are `PackedLinear`s in the same children (same
state-dict names, same modules for LoRA's forward hooks). A hooked w1 or w3 (a LoRA adapter
adapts it), or one no longer packed, takes the plain path, so a hook still sees and changes
its output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def can_fuse_swiglu(ffn: nn.Module) -> bool:
    """True for an unfused SwiGLU FeedForward whose gate and up are packed linears of one dtype
    (bf16 or fp32)."""
    # cpu_linear's PackedLinear by its attributes: cpu_linear imports this module
    w1, w3 = getattr(ffn, "w1", None), getattr(ffn, "w3", None)
    return (
        not isinstance(ffn, PackedSwiGLU)
        and getattr(ffn, "act", None) is F.silu
        and all(hasattr(w, "packed_weight") and w.bias is None for w in (w1, w3))
        and w1.dtype == w3.dtype
        and w1.dtype in (torch.bfloat16, torch.float32)
    )


class PackedSwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x) with silu and the product applied in w1's and w3's epilogues."""

    def __init__(self, ffn: nn.Module) -> None:
        super().__init__()
        if not can_fuse_swiglu(ffn):
            raise ValueError("PackedSwiGLU needs a silu FeedForward with packed w1, w3")
        self.hidden_dim = ffn.hidden_dim
        self.act = ffn.act
        self.w1, self.w2, self.w3 = ffn.w1, ffn.w2, ffn.w3  # declaration order of FeedForward

    def _fusable(self) -> bool:
        """Whether gate and up are still packed (someone may have swapped them back) and
        unhooked (a LoRA adapter's hook edits their outputs)."""
        w1, w3 = self.w1, self.w3
        packed = hasattr(w1, "packed_weight") and hasattr(w3, "packed_weight")
        return packed and not (w1._forward_hooks or w3._forward_hooks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._fusable():
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        a = x.reshape(-1, self.w1.in_features).to(self.w1.dtype).contiguous()
        pointwise = torch.ops.mkldnn._linear_pointwise
        gate = pointwise(a, self.w1.packed_weight.packed, None, "swish", [], "")
        hidden = pointwise.binary(a, gate, self.w3.packed_weight.packed, None, "mul")
        out = self.w2(hidden)
        return out.to(x.dtype).view(*x.shape[:-1], out.shape[-1])
