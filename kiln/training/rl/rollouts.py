"""Where a loop's rollout engines run: in this process (`rollout.workers: 0`) or on Ray actors;
both offer generate / refit / checksums / engine_names / close and count `restarts`."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from kiln.training.rl.config import OnPolicyConfig
from kiln.training.rl.local_rollouts import LocalRollouts
from kiln.training.rl.ray_rollouts import RayRollouts
from kiln.training.rl.refit import merged_policy_state


def open_rollouts(
    cfg: OnPolicyConfig, policy: nn.Module, tokenizer, eos_token_ids: Sequence[int]
) -> LocalRollouts | RayRollouts:
    """The rollout engines of `policy` (before LoRA is applied: the engines hold plain weights)."""
    if cfg.rollout.workers == 0:
        return LocalRollouts(
            policy, tokenizer, eos_token_ids, cfg.max_batch_size, cfg.rollout.recompute_logprobs
        )
    return RayRollouts(
        cfg.rollout,
        merged_policy_state(policy),
        policy.cfg,
        tokenizer,
        eos_token_ids,
        cfg.max_batch_size,
    )
