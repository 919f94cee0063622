"""The launchers' choices for GPUs, decided without one: the process-group backend string (real
torch accepts it: a gloo group on CPU answers the CPU all-reduce) and one GPU per rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from kiln.platform.errors import ConfigError
from kiln.training.launch import local_cuda_index, process_group_backend


def test_optimizer_offload_on_gpus_gets_a_cpu_backend():
    assert process_group_backend(cuda=True, cpu_collectives=True) == "cuda:nccl,cpu:gloo"
    assert process_group_backend(cuda=True, cpu_collectives=False) == "nccl"
    assert process_group_backend(cuda=False, cpu_collectives=True) == "gloo"


def test_the_cpu_half_of_the_backend_string_reduces_cpu_tensors(tmp_path):
    """torch parses the compound string; its cpu:gloo half does the offloaded grad-norm reduce."""
    backend = process_group_backend(cuda=True, cpu_collectives=True).replace("cuda:nccl,", "")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    try:
        grad_sq = torch.tensor([4.0])
        dist.all_reduce(grad_sq)
        assert grad_sq.item() == 4.0
        assert dist.get_backend() == "cpu:gloo"
    finally:
        dist.destroy_process_group()


def test_one_gpu_per_rank():
    assert local_cuda_index(local_rank=3, local_world_size=8, device_count=8) == 3
    with pytest.raises(ConfigError, match="2 ranks on this node but 1 visible GPU"):
        local_cuda_index(local_rank=1, local_world_size=2, device_count=1)
    with pytest.raises(ConfigError, match="no CUDA device"):
        local_cuda_index(local_rank=0, local_world_size=1, device_count=0)
