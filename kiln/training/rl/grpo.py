"""The GRPO loop: rollouts on Kiln's engine (in this process or on Ray actors: on_policy.py) ->
rewards -> group advantages -> `num_iterations` clipped-ratio updates of the policy -> refit of
the engines' weights.

The policy is a kiln `Transformer` (full fine-tuning, or LoRA adapters via kiln/model/lora.py).
Reference log-probs come from the frozen base: the same model with its adapters disabled under
LoRA, a frozen copy only for full fine-tuning with beta > 0. Each engine decodes from its own
plain copy of the weights (the engine lays out the LM head for decoding, and LoRA is merged
into it at each refit), so at `max_policy_lag: 0` a step's rollouts use the latest policy.

Async (`max_policy_lag` L > 0): the engines sample the next L steps' batches while this step
trains (on_policy.py `take_batch`), so a step's rollouts come from a policy up to L updates old
(`policy_lag`, logged). The clipped ratio stays relative to the trainer's log-probs at the
step's start (the proximal policy); the truncated importance weight min(pi_trainer /
pi_behaviour, tis_cap), with the engine's sampling log-probs as pi_behaviour, corrects for the
staleness (decoupled PPO, Hilton et al. 2022 and AReaL; TIS, Yao et al. 2025).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kiln.model.lora import adapters_disabled
from kiln.platform.errors import KilnError
from kiln.training.rl.batch_split import BatchSplit
from kiln.training.rl.config import GRPOConfig
from kiln.training.rl.logprobs import completion_logprobs, mismatch
from kiln.training.rl.objectives import (
    behaviour_ratio,
    group_advantages,
    grpo_loss,
    informative_groups,
    overlong_filter,
    tis_weights,
)
from kiln.training.rl.on_policy import OnPolicyLoop
from kiln.training.rl.rewards import RewardSet
from kiln.training.rl.rollout import Rollout, RolloutBackend


@dataclass
class UpdateBatch:
    """What the last update trained on, for inspection: its rollouts, the trainer's log-probs
    at the step's start, the engine's (behaviour policy's) and their ratio, per token."""

    rollouts: list[Rollout]
    old_logp: torch.Tensor  # [B, T] the trainer's, before this step's updates
    behaviour_logp: torch.Tensor  # [B, T] the engine's, as it sampled
    mask: torch.Tensor  # [B, T]
    is_ratio: torch.Tensor  # [B, T] exp(old_logp - behaviour_logp), before the cap


class GRPO(OnPolicyLoop):
    """`run()` trains `policy` in place; `metrics` holds one dict per step."""

    cfg: GRPOConfig

    def __init__(
        self,
        policy: nn.Module,
        tokenizer,
        rows: Sequence[dict],
        cfg: GRPOConfig,
        *,
        chat_template=None,
        eos_token_ids: Sequence[int] | None = None,
        rollouts: RolloutBackend | None = None,
    ) -> None:
        super().__init__(
            policy,
            tokenizer,
            rows,
            cfg,
            chat_template=chat_template,
            eos_token_ids=eos_token_ids,
            rollouts=rollouts,
        )
        self.rewards = RewardSet.from_specs(cfg.rewards)
        self.lag = cfg.max_policy_lag
        self.last_update: UpdateBatch | None = None
        self.reference = None
        if cfg.lora is None and cfg.beta > 0:
            self.reference = copy.deepcopy(policy).eval().requires_grad_(False)

    def evaluate(self, rows: Sequence[dict]) -> float:
        """Mean reward of greedy completions of `rows` under the engine's current weights."""
        prompts, rollouts = self.greedy(rows)
        texts = [self.decode(r.completion_ids) for r in rollouts]
        results = self.rewards.score(prompts, texts, list(rows))
        return statistics.fmean(r.total for r in results)

    def step(self, step: int) -> dict:
        cfg, started = self.cfg, time.perf_counter()
        picked, rollouts = self.take_batch(step, cfg.group_size)
        rollout_s = time.perf_counter() - started  # sampled ahead: only the wait for the rest
        lag = self.policy_version - min(r.policy_version for r in rollouts)
        if lag > self.lag:  # the engines' queue order guarantees it; a broken one must not train
            raise KilnError(
                f"step {step + 1}: rollouts {lag} updates old, max_policy_lag {self.lag}"
            )
        rows = [self.rows[picked[r.prompt_index]] for r in rollouts]
        texts = [self.decode(r.completion_ids) for r in rollouts]
        results = self.rewards.score(
            [self.prompts[picked[r.prompt_index]] for r in rollouts], texts, rows
        )
        rewards = torch.tensor([r.total for r in results], dtype=torch.float64)
        advantages = group_advantages(rewards, cfg.group_size, cfg.scale_rewards)
        keep = torch.ones(len(rollouts), dtype=torch.bool)
        if cfg.dynamic_sampling:
            keep = informative_groups(rewards, cfg.group_size)
        m = self._reward_metrics(step, rewards, results, rollouts, keep)
        m["policy_lag"] = float(lag)
        train_started, train_cpu = time.perf_counter(), time.process_time()
        if keep.any():
            m.update(self._update([r for r, k in zip(rollouts, keep, strict=True) if k],
                                  advantages[keep]))  # fmt: skip
        train_s = time.perf_counter() - train_started
        # the process's CPU seconds in the update (forward, backward, optimizer): on a shared
        # host a steadier figure than its wall time
        m["train_cpu_s"] = time.process_time() - train_cpu
        m.update(self.refit())
        generated = sum(len(r.completion_ids) for r in rollouts)
        m["rollout_wait_s"] = rollout_s
        # sampled ahead, generation overlaps training: count it against the whole step
        sampling_s = rollout_s if self.lag == 0 else time.perf_counter() - started
        m["rollout_tokens_per_s"] = generated / max(sampling_s, 1e-9)
        m["train_tokens_per_s"] = (
            cfg.num_iterations * sum(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
        ) / max(train_s, 1e-9)
        m["rollout_share"] = rollout_s / max(time.perf_counter() - started, 1e-9)
        m["step_s"] = time.perf_counter() - started
        self.metrics.append(m)
        return m

    def _reward_metrics(self, step, rewards, results, rollouts, keep) -> dict:
        m = {
            "step": step + 1,
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "completion_len": statistics.fmean(len(r.completion_ids) for r in rollouts),
            "kept_fraction": float(keep.double().mean()),
            "reward_failures": sum(len(r.failures) for r in results),
        }
        for name in self.rewards.names:
            m[f"reward/{name}"] = statistics.fmean(r.parts[name] for r in results)
        return m

    def _scores(self, model, rollouts: list[Rollout]):
        return completion_logprobs(
            model,
            [r.prompt_ids for r in rollouts],
            [r.completion_ids for r in rollouts],
            self.cfg.temperature,
        )

    def _reference_logp(self, rollouts: list[Rollout]) -> torch.Tensor | None:
        if self.cfg.beta == 0:
            return None
        with torch.no_grad():
            if self.reference is not None:
                return self._scores(self.reference, rollouts).logp
            with adapters_disabled(self.policy):
                return self._scores(self.policy, rollouts).logp

    def _update(self, rollouts: list[Rollout], advantages: torch.Tensor) -> dict:
        """`num_iterations` updates on the batch; under a data-parallel layout (layouts.py)
        each rank takes its share and every figure returned is the whole batch's."""
        cfg = self.cfg
        n = len(rollouts)
        split = self.split if self.split.active(n) else BatchSplit()
        lo, hi = split.bounds(n)
        rollouts, advantages = rollouts[lo:hi], advantages[lo:hi]
        # listed before any forward: FSDP2 swaps its root's unsharded parameters in until the
        # backward, and their gradients land on the sharded ones
        params = [p for p in self.policy.parameters() if p.requires_grad]
        # the first forward is both iteration 1's graph and the batch's old log-probs
        scores = self._scores(self.policy, rollouts)
        old_logp, mask = scores.logp.detach(), scores.mask
        if cfg.overlong_filter:
            mask = overlong_filter(mask, torch.tensor([r.truncated for r in rollouts]))
        engine = torch.zeros_like(old_logp)
        for i, r in enumerate(rollouts):
            engine[i, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=torch.float64)
        lp_mean, lp_max = mismatch(engine, old_logp, scores.mask)
        ratio = behaviour_ratio(old_logp, engine, scores.mask)
        self.last_update = UpdateBatch(rollouts, old_logp, engine, scores.mask, ratio)
        tis = None if cfg.tis_cap is None else tis_weights(old_logp, engine, mask, cfg.tis_cap)
        real = scores.mask > 0
        ref = self._reference_logp(rollouts)
        entropy = float((scores.entropy * scores.mask).sum() / scores.mask.sum().clamp(min=1.0))
        # this rank's share of what the loss averages over: FSDP2 averages the ranks' gradients,
        # so a share weighted share x ranks sums to the whole batch's loss
        if cfg.loss_aggregation == "token":
            share = float(mask.sum()) / max(split.total(float(mask.sum())), 1.0)
        else:
            share = (hi - lo) / n
        for iteration in range(cfg.num_iterations):
            if iteration > 0:
                scores = self._scores(self.policy, rollouts)
            self.optimizer.zero_grad(set_to_none=True)
            loss, stats = grpo_loss(
                scores.logp,
                old_logp,
                advantages,
                mask,
                ref_logp=ref,
                beta=cfg.beta,
                epsilon_low=cfg.epsilon_low,
                epsilon_high=cfg.epsilon_high,
                aggregation=cfg.loss_aggregation,
                importance_level=cfg.importance_sampling_level,
                max_completion_length=cfg.max_new_tokens,
                tis=tis,
            )
            if split.size > 1:
                loss = loss * (share * split.size)
            loss.backward()
            grad_norm = self.clip_grads(params)
            self.optimizer.step()
        tokens, loss_tokens = float(real.sum()), float(mask.sum())
        truncated = (
            float((ratio[real] > cfg.tis_cap).double().mean())
            if cfg.tis_cap is not None and real.any()
            else 0.0
        )
        return {
            "loss": split.total(float(loss.detach()) / split.size),
            "kl": split.mean(stats.kl, loss_tokens),
            "clip_fraction": split.mean(stats.clip_fraction, loss_tokens),
            "entropy": split.mean(entropy, tokens),
            "grad_norm": float(grad_norm),
            "logprob_mismatch_mean": split.mean(lp_mean, tokens),
            "logprob_mismatch_max": split.maximum(lp_max),
            "is_ratio_mean": split.mean(float(ratio[real].mean()) if real.any() else 1.0, tokens),
            "is_ratio_max": split.maximum(float(ratio[real].max()) if real.any() else 1.0),
            "is_truncated_fraction": split.mean(truncated, tokens),
        }


def format_step(m: dict) -> str:
    """The console's one line per step."""
    parts = [
        f"step {m['step']}",
        f"reward {m['reward']:.3f}±{m['reward_std']:.3f}",
        f"kl {m.get('kl', 0.0):.4f}",
        f"clip {m.get('clip_fraction', 0.0):.2f}",
        f"entropy {m.get('entropy', 0.0):.2f}",
        f"len {m['completion_len']:.1f}",
        f"lp-mismatch {m.get('logprob_mismatch_max', 0.0):.1e}",
        f"lag {m.get('policy_lag', 0.0):.0f}",
        f"rollout {m['rollout_tokens_per_s']:.0f} tok/s",
        f"train {m['train_tokens_per_s']:.0f} tok/s",
        f"refit {m['refit_s']:.3f}s",
    ]
    return " | ".join(parts)
