"""Launcher decisions both entry points share (torchrun and Ray Train)."""

from __future__ import annotations

from kiln.platform.errors import ConfigError


def process_group_backend(cuda: bool, cpu_collectives: bool) -> str:
    """NCCL on GPUs, plus gloo for CPU tensors when some live there.

    `optimizer_offload` keeps gradients on the CPU (FSDP2's CPUOffloadPolicy), so the gradient-norm
    all-reduce runs on CPU tensors, which an NCCL-only group refuses.
    """
    if not cuda:
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cpu_collectives else "nccl"


def local_cuda_index(local_rank: int, local_world_size: int, device_count: int) -> int:
    """This rank's GPU: one rank per GPU, refused up front rather than as NCCL's "Duplicate GPU"."""
    if device_count < 1:
        raise ConfigError("device=cuda but no CUDA device is visible")
    if local_world_size > device_count:
        raise ConfigError(
            f"{local_world_size} ranks on this node but {device_count} visible GPU(s): NCCL needs "
            f"one GPU per rank (--nproc-per-node {device_count}, or more GPUs)"
        )
    if not 0 <= local_rank < device_count:
        raise ConfigError(f"LOCAL_RANK={local_rank} but only {device_count} GPU(s) are visible")
    return local_rank


def init_process_group_from_env(device: str, optimizer_offload: bool) -> None:
    """Under torchrun (RANK / WORLD_SIZE set): pin this rank's GPU and join the process group.
    Both torchrun entry points (pretraining and post-training) start this way."""
    import os

    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and "RANK" not in os.environ:
        return
    cuda = torch.cuda.is_available() and device != "cpu"
    if cuda:
        torch.cuda.set_device(
            local_cuda_index(
                int(os.environ.get("LOCAL_RANK", "0")),
                int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                torch.cuda.device_count(),
            )
        )
    dist.init_process_group(process_group_backend(cuda, optimizer_offload))


def resolve_auto_precision(cfg, cuda_available: bool):
    """`precision: auto` is bf16 when the run is on CUDA, fp32 on CPU (a TrainConfig copy)."""
    if cfg.precision != "auto":
        return cfg
    on_cuda = cfg.device == "cuda" or (cfg.device == "auto" and cuda_available)
    return cfg.model_copy(update={"precision": "bf16" if on_cuda else "fp32"})


def resolve_auto_compile(cfg, cuda_available: bool):
    """`parallel.compile: null` is on when the run is on CUDA (per-block torch.compile is part
    of the GPU speed), off on CPU (compiling costs more than a short CPU run gains)."""
    if cfg.parallel.compile is not None:
        return cfg
    on_cuda = cfg.device == "cuda" or (cfg.device == "auto" and cuda_available)
    parallel = cfg.parallel.model_copy(update={"compile": on_cuda})
    return cfg.model_copy(update={"parallel": parallel})


def enable_tf32() -> None:
    """fp32 matmuls (and cuDNN convolutions) on TF32 tensor cores: on CUDA only, where the
    datasheet's fp32 matmul peak is TF32's; on CPU "high" could lower oneDNN's fp32 matmuls."""
    import torch

    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
