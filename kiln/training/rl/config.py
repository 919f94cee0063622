"""The options of the on-policy loops: what every loop that samples from the policy shares
(`OnPolicyConfig`: sampling, optimizer, LoRA, where the rollouts run) and GRPO's own, TRL's
names where they exist (num_generations is `group_size`, epsilon is `epsilon_low`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kiln.model.lora import LoRAConfig
from kiln.platform.errors import ConfigError
from kiln.training.config import OptimizerConfig, ParallelConfig
from kiln.training.rl.rewards import RewardSpec

PARALLEL_HELP = (
    "The policy laid out over ranks with the trainer's layouts (dp_shard: FSDP2, each rank "
    "scoring and sampling its share of a step; tp): the stage and the command start one Ray "
    "Train worker per rank ({entry}). pp, cp, ep, dp_replicate: a ConfigError. None: one "
    "process."
)


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workers: int = Field(
        0,
        ge=0,
        description="Rollout workers as Ray actors, each holding an engine (0: the engine runs "
        "in this process and refit is an in-place copy).",
    )
    cpus_per_worker: float = Field(
        0.5, gt=0, description="Ray CPUs each rollout actor reserves (fractional on small hosts)."
    )
    max_retries: int = Field(
        3, ge=0, description="A dead rollout actor is replaced and its share retried this often."
    )
    recompute_logprobs: bool = Field(
        False,
        description="Deterministic log-probs: after sampling, the engine scores its completions "
        "with one full forward, as the trainer does, so on CPU fp32 (full fine-tuning) they "
        "equal the trainer's bit for bit (off: the sampler's own, from the KV-cache decode).",
    )
    batch_invariant: bool = Field(
        True,
        description="The policy's attention runs the batch-invariant backend "
        "(`attention_backend: invariant`) and every matmul gets >= 16 rows, so the engine's "
        "KV-cache decode and the trainer's full forward give the same logits: on CPU fp32 (full "
        "fine-tuning) the sampling log-probs equal the trainer's bit for bit, for no extra "
        "forward (off: SDPA's kernel, and they differ in the last bits, ~2e-5 on SmolLM2).",
    )
    verify_refit: bool = Field(
        True,
        description="After each refit, compare a checksum of every actor's weights with the "
        "trainer's (Ray workers only; an in-process engine is copied in place).",
    )


class OnPolicyConfig(BaseModel):
    """What every loop that samples from the policy it trains shares."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(20, ge=1, description="Policy updates (each on a fresh batch).")
    prompts_per_step: int = Field(4, ge=1, description="Prompts sampled per step.")
    max_new_tokens: int = Field(64, ge=1, description="Completion length limit.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus of the rollouts' sampling.")
    prompt_format: Literal["chat", "raw"] = Field(
        "chat", description="A plain `prompt` as one user message (chat) or verbatim (raw)."
    )
    seed: int = Field(0, ge=0, description="Prompt order and every completion's sampling seed.")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=1e-5, weight_decay=0.0),
        description="AdamW (lr 1e-5, no weight decay unless set).",
    )
    lora: LoRAConfig | None = Field(None, description="Train LoRA adapters (None: full model).")
    max_batch_size: int = Field(64, ge=1, description="Engine KV-cache slots for rollouts.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Where the rollout engines run (Ray actors)."
    )
    checkpoint_interval: int = Field(
        0,
        ge=0,
        description="Save the loop's state (policy, optimizer, prompt order, metrics) every N "
        "steps; a run started again on the same output resumes from it (0: never).",
    )


class GRPOConfig(OnPolicyConfig):
    rewards: list[RewardSpec] = Field(..., min_length=1, description="Weighted rewards, summed.")
    group_size: int = Field(8, ge=2, description="Completions per prompt (G).")
    beta: float = Field(0.0, ge=0, description="Weight of the k3 KL to the reference model.")
    epsilon_low: float = Field(0.2, ge=0, description="Clip: ratio >= 1 - epsilon_low.")
    epsilon_high: float = Field(0.2, ge=0, description="Clip: ratio <= 1 + epsilon_high (DAPO).")
    loss_aggregation: Literal["token", "sequence", "dr_grpo"] = Field(
        "token",
        description="token: every token weighs the same; sequence: per-completion mean, then "
        "mean; dr_grpo: token sum / (completions x max_new_tokens).",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="sequence: GSPO's length-normalised sequence ratio."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Advantages divided by the group's reward std, the batch's, or none."
    )
    num_iterations: int = Field(1, ge=1, description="Updates per batch (mu), with ratios.")
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal."
    )
    overlong_filter: bool = Field(False, description="DAPO: truncated completions get no loss.")
    tis_cap: float | None = Field(
        2.0,
        gt=0,
        description="Truncated importance sampling cap: tokens weighted by min(pi_trainer / "
        "pi_behaviour, cap), the behaviour policy being the engine's weights the rollouts were "
        "sampled with (None: off).",
    )
    max_policy_lag: int = Field(
        0,
        ge=0,
        description="Async rollouts: the engines sample up to this many steps ahead with the "
        "weights they hold, so a step trains on rollouts of a policy at most this many updates "
        "old, corrected by tis_cap (0: on-policy, each step samples after the last refit).",
    )

    @model_validator(mode="after")
    def _check_off_policy(self) -> GRPOConfig:
        if self.max_policy_lag > 0 and self.tis_cap is None:
            # without the behaviour policy's ratio, stale rollouts bias the gradient silently
            raise ConfigError(
                "tis_cap: max_policy_lag > 0 needs the importance correction; set a cap (e.g. 2.0)"
            )
        return self


class GRPORunConfig(GRPOConfig):
    """GRPOConfig plus what a run reads: the model and the prompts."""

    base: str | None = Field(
        None, description="The policy's start: an ExportedModel, HF folder or kiln checkpoint."
    )
    prompts: str | None = Field(None, description="Prompt rows: a .jsonl or .parquet file.")
    chat_template: str | None = Field(
        None,
        description="A built-in template name or a tokenizer folder (default: the model's own, "
        "if it has one).",
    )
    eval_prompts: str | None = Field(
        None,
        description="Held-out prompt rows scored before and after training (greedy decoding, "
        "the same rewards): math_exact's mean is the accuracy.",
    )
    eval_limit: int = Field(64, ge=1, description="Score at most this many held-out rows.")
    parallel: ParallelConfig | None = Field(
        None, description=PARALLEL_HELP.format(entry="`torchrun -m kiln.training.rl.run` too")
    )
