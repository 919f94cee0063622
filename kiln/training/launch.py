"""Launcher decisions both entry points share (torchrun and Ray Train), as pure functions."""

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
