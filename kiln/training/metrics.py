"""Throughput accounting: FLOPs per token (6N + 12·L·H·Q·T), device peaks, MFU, peak memory."""

from __future__ import annotations

import resource

import torch

from kiln.training.model.config import ModelConfig

# Dense (no sparsity) peak TFLOP/s per GPU by precision, from vendor data sheets.
_PEAK_TFLOPS = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "fp32": 67.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp8": 733.0, "fp32": 91.6},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp32": 80.0},
}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (non-embedding, active) params + 12·L·H·Q·T for attention."""
    n = cfg.num_params(exclude_embedding=True)
    if cfg.n_experts:
        inactive = 3 * cfg.dim * cfg.ffn_hidden_dim * (cfg.n_experts - cfg.top_k) * cfg.n_layers
        n -= inactive
    return 6 * n + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


def device_peak_flops(precision: str, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of this device for `precision`; None when unknown (CPUs, unlisted GPUs)."""
    if override_tflops:
        return override_tflops * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    for key, peaks in _PEAK_TFLOPS.items():
        if key in name:
            return peaks.get(precision, peaks["bf16"]) * 1e12
    return None


def peak_memory_gb() -> float:
    """Peak accelerator memory allocated (GPU) or the process's peak RSS (CPU), in GB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
