"""The policy of an on-policy loop laid out over a process group: FSDP2 (`dp_shard`) and tensor
parallelism (`tp`), the trainer's own layouts (kiln/training/parallel).

Every rank runs the whole loop: the same prompts, the same seeded rollouts from its own engine
(which holds the gathered, unsharded weights: `merged_policy_state` gathers them at each refit),
the same rewards. The update then splits: under FSDP2 each data-parallel rank scores its share
of the completions (batch_split.py) and keeps a shard of the parameters, gradients and AdamW
state; TP ranks score the same completions, each block's matmuls split between them. So a run
equals the one-process run (tests/training/rl/test_layouts.py) with the policy's memory and the
update's work spread over the ranks (the sampling is not: every rank samples the whole batch).
On-policy distillation takes the same layouts; its ranks each score the whole batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy

from kiln.platform.errors import ConfigError
from kiln.training.config import ParallelConfig
from kiln.training.optimizer import build_optimizer
from kiln.training.parallel.data_parallel import apply_fsdp
from kiln.training.parallel.dims import ParallelDims
from kiln.training.parallel.tensor_parallel import apply_tensor_parallel
from kiln.training.rl.batch_split import BatchSplit
from kiln.training.rl.on_policy import OnPolicyLoop


def shard_policy(loop: OnPolicyLoop, parallel: ParallelConfig, world_size: int) -> ParallelDims:
    """`loop.policy` laid out over this process group (initialised, `world_size` ranks) in
    place, its optimizer rebuilt over the sharded parameters; the layout's dims."""
    if parallel.pp > 1 or parallel.cp > 1 or parallel.ep > 1 or parallel.dp_replicate > 1:
        raise ConfigError(
            "parallel: on-policy loops take dp_shard and tp; pp, cp, ep and dp_replicate "
            "are not supported here"
        )
    frozen = {name for name, p in loop.policy.named_parameters() if not p.requires_grad}
    dims = ParallelDims.from_config(parallel, world_size)
    device = next(loop.policy.parameters()).device
    dims.build_mesh(device.type)
    if dims.tp_enabled:
        # the head's output replicated: the log-probs need every vocabulary entry per token
        apply_tensor_parallel(loop.policy, dims.mesh("tp"), loss_parallel=False)
    if dims.fsdp_enabled:
        dtype = next(loop.policy.parameters()).dtype
        mp_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        apply_fsdp(loop.policy, dims.mesh("dp_shard_cp"), mp_policy, reshard_after_forward=True)
    # distributing a parameter makes a new one that requires grad: LoRA's frozen base (the
    # norms TP replicates) would train
    for name, p in loop.policy.named_parameters():
        p.requires_grad_(name not in frozen)
    loop.optimizer = build_optimizer(loop.policy, loop.cfg.optimizer)
    if dims.dp_enabled and hasattr(loop, "split"):
        loop.split = BatchSplit(dims.dp_rank, dims.dp_size, dims.mesh("dp").get_group())
    return dims


def lay_out_run(loop: OnPolicyLoop, parallel: ParallelConfig) -> bool:
    """A run's `parallel:` layout on the process group torchrun started; True on the rank that
    writes the run's files."""
    if not dist.is_initialized():
        raise ConfigError(
            "parallel: a layout needs its ranks: launch with `torchrun --nproc-per-node N -m "
            "kiln.training.rl.run --config FILE --out DIR`"
        )
    if loop.cfg.checkpoint_interval:
        raise ConfigError("checkpoint_interval: a laid-out run does not save its state yet (0)")
    shard_policy(loop, parallel, dist.get_world_size())
    return dist.get_rank() == 0
