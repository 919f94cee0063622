"""RL post-training with verifiable rewards: prompt sets, rewards, rollouts and GRPO-family
objectives on Kiln's own engine."""
