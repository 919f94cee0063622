"""Throughput accounting: FLOPs per token (6N + attention), datasheet device peaks, peak memory."""

from __future__ import annotations

import resource

import torch

from kiln.model.config import ModelConfig

# Dense (no 2:4 sparsity) peak TFLOP/s per GPU from NVIDIA's data sheets (which print the sparse
# figure: half of it). "tf32" is the fp32 matmul peak when TF32 is on (kiln turns it on on CUDA).
# Ordered most specific first: torch names an SXM H100 "NVIDIA H100 80GB HBM3", an SXM H200
# "NVIDIA H200", the PCIe and NVL boards "... H100 PCIe", "... H100 NVL", "... H200 NVL".
_PEAK_TFLOPS = {
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "tf32": 417.5, "fp32": 60.0},
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "tf32": 417.5, "fp32": 60.0},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},  # SXM
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},  # SXM
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},  # SXM and PCIe
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1100.0, "fp32": 75.0},
}


def attended_keys(seq_len: int, window: int | None = None) -> float:
    """Mean keys a query attends to under the causal mask (and a sliding window of `window`)."""
    w = min(window or seq_len, seq_len)
    # queries 0..w-1 see 1..w keys; the other seq_len-w queries see w each
    return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (active matmul params) + 12·L·H·Q·(keys attended).

    The LM head is a matmul even when it shares the embedding's weight (tied); the embedding
    lookup is not. Attention counts the keys a causal (windowed) query actually sees, as the
    fused kernels compute them: about T/2, not T. Multi-token prediction adds its modules'
    blocks and projections and one more head matmul per module.
    """
    n = cfg.num_params(exclude_embedding=True)  # multi-token prediction's modules included
    if cfg.tie_embeddings:
        n += cfg.vocab_size * cfg.dim
    n += cfg.mtp_depth * cfg.vocab_size * cfg.dim  # each MTP module runs the head once more
    blocks = cfg.n_layers + cfg.mtp_depth
    if cfg.n_experts:  # experts a token is not routed to do no work for it
        n -= sum(cfg.ffn_params(i) - cfg.ffn_params(i, active=True) for i in range(blocks))
    keys = attended_keys(seq_len, cfg.sliding_window)
    # q.k over the query/key width, attention x v over the value width (MLA: different widths)
    width = cfg.head_dim if cfg.mla is None else (cfg.mla.qk_head_dim + cfg.mla.v_head_dim) / 2
    return 6 * n + 12 * blocks * cfg.n_heads * width * keys


def peak_tflops_for(device_name: str, precision: str, tf32: bool = True) -> float | None:
    """Datasheet dense peak of the GPU named `device_name` for `precision`; None when unknown."""
    for key, peaks in _PEAK_TFLOPS.items():
        if key in device_name:
            if precision == "fp32":
                return peaks["tf32"] if tf32 else peaks["fp32"]
            return peaks.get(precision, peaks["bf16"])
    return None


def device_peak_flops(precision: str, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of this device for `precision`; None when unknown (CPUs, unlisted GPUs)."""
    if override_tflops:
        return override_tflops * 1e12
    if not torch.cuda.is_available():
        return None
    tf32 = torch.get_float32_matmul_precision() != "highest"
    tflops = peak_tflops_for(torch.cuda.get_device_name(), precision, tf32)
    return tflops * 1e12 if tflops else None


def peak_memory_gb() -> float:
    """Peak accelerator memory allocated (GPU) or the process's peak RSS (CPU), in GB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
