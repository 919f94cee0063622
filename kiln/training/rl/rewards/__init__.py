"""Rewards for RL post-training: `(prompt, completion, row) -> float` callables, built-ins
(math_exact, regex, json_schema, length_penalty, code) and their weighted combination."""

from kiln.training.rl.rewards.reward_set import RewardResult, RewardSet, RewardSpec
from kiln.training.rl.rewards.types import Reward, RewardFailed

__all__ = ["Reward", "RewardFailed", "RewardResult", "RewardSet", "RewardSpec"]
