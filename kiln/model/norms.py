"""RMSNorm as in Llama (and HF's LlamaRMSNorm): normalise in fp32, scale in the input dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # torch's fused op: the same values in fewer, cheaper ops
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
