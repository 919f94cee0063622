"""The policy of an on-policy loop laid out over a process group: FSDP2 (`dp_shard`) and tensor
parallelism (`tp`), the trainer's own layouts (kiln/training/parallel).

Every rank runs the whole loop: the same prompts, the same seeded rollouts (its engine holds
the gathered, unsharded weights: `merged_policy_state` gathers them at each refit), the same
rewards. The update then splits: under FSDP2 each data-parallel rank scores its share
of the completions (batch_split.py) and keeps a shard of the parameters, gradients and AdamW
state; TP ranks score the same completions, each block's matmuls split between them. So a run
equals the one-process run (tests/training/rl/test_layouts.py) with the policy's memory and the
update's work spread over the ranks. The sampling is spread too (rank_rollouts.py): in-process
engines each sample a share of the batch, which is all-gathered; Ray actors belong to rank 0.
On-policy distillation takes the same layouts and splits the same way: under FSDP2 each rank's
teacher and student score only that rank's share of the completions.

The `grpo` / `distill` stages and `kiln grpo` / `kiln distill` start the ranks on Ray Train
(ray_launch.py); `torchrun -m kiln.training.rl.run` starts them for GRPO.
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
from kiln.training.rl.loop_state import GatheredState
from kiln.training.rl.on_policy import OnPolicyLoop
from kiln.training.rl.rank_rollouts import share_rollouts

# why each layout the trainer has and the on-policy loops do not take is refused
REFUSED = {
    "pp": "the loops score completions with one forward of the whole model, not the trainer's "
    "pipeline schedule",
    "cp": "the loops score each completion on one rank; ring attention over rollouts is not "
    "wired in",
    "ep": "expert parallelism is not wired into the loops",
    "dp_replicate": "replicated data parallelism (HSDP) is not wired into the loops",
}


def check_layout(parallel: ParallelConfig, field: str = "parallel") -> None:
    """The ConfigError naming `field`'s first dim the on-policy loops cannot run on."""
    for dim, why in REFUSED.items():
        if getattr(parallel, dim) > 1:
            raise ConfigError(
                f"{field}.{dim}={getattr(parallel, dim)}: on-policy loops take dp_shard and tp "
                f"({why})"
            )


def layout_world_size(parallel: ParallelConfig | None, field: str = "parallel") -> int:
    """The ranks a run's `parallel:` needs (1: none, run in one process), checked up front."""
    if parallel is None:
        return 1
    check_layout(parallel, field)
    return ParallelDims.from_config(parallel).world_size


def shard_policy(
    loop: OnPolicyLoop, parallel: ParallelConfig, world_size: int, field: str = "parallel"
) -> ParallelDims:
    """`loop.policy` laid out over this process group (initialised, `world_size` ranks) in
    place, its optimizer rebuilt over the sharded parameters, its rollout engines shared over
    the ranks; the layout's dims."""
    check_layout(parallel, field)
    heads, kv_heads = loop.policy.cfg.n_heads, loop.policy.cfg.n_kv_heads
    if heads % parallel.tp or kv_heads % parallel.tp:  # found here, not deep in TP's plan
        raise ConfigError(
            f"{field}.tp={parallel.tp} must divide the model's n_heads ({heads}) and "
            f"n_kv_heads ({kv_heads})"
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
    loop.rollouts = share_rollouts(loop.rollouts)
    loop.trainer_state = GatheredState()  # resume: one whole state, written by rank 0
    return dims


def require_ranks(field: str = "parallel") -> None:
    """A layout runs on the process group its launcher started (Ray Train or torchrun)."""
    if not dist.is_initialized():
        raise ConfigError(
            f"{field}: a layout needs its ranks: run it with `kiln grpo` / `kiln distill` or "
            "the stage (Ray Train starts them), or `torchrun --nproc-per-node N -m "
            "kiln.training.rl.run --config FILE --out DIR`"
        )


def lay_out_run(loop: OnPolicyLoop, parallel: ParallelConfig, field: str = "parallel") -> bool:
    """A run's `parallel:` layout on the process group its launcher started; True on the rank
    that writes the run's files."""
    require_ranks(field)
    shard_policy(loop, parallel, dist.get_world_size(), field)
    return dist.get_rank() == 0
