"""On-policy distillation (Agarwal et al. 2024, GKD with the student's own samples; Thinking
Machines' "on-policy distillation"): the student samples completions on Kiln's engine, the
teacher scores every sampled position, and the student minimises the per-token divergence
(reverse KL by default) to the teacher over the whole vocabulary at those positions.

The loop is GRPO's machinery (on_policy.py): the same rollout engines, in this process or on
Ray actors, the same refit after each update, LoRA or full fine-tuning. The teacher is any
model with the student's tokenizer, frozen, in this process (whole on every rank). Under a
data-parallel layout (layouts.py) each rank scores only its share of the batch, with the
teacher and the student, as GRPO does (batch_split.py): the loss is weighted so that FSDP2's
gradient average is the whole batch's, and every reported figure is the whole batch's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from kiln.platform.errors import ConfigError
from kiln.training.post.divergence import token_divergence
from kiln.training.rl.batch_split import BatchSplit
from kiln.training.rl.distill_config import DistillConfig
from kiln.training.rl.logprobs import completion_logits, token_logprobs
from kiln.training.rl.on_policy import OnPolicyLoop
from kiln.training.rl.rollout import Rollout, RolloutBackend

EVAL_SEED_OFFSET = 1 << 40  # held-out sampling seeds, apart from every training step's


class OnPolicyDistill(OnPolicyLoop):
    """`run()` trains the student (`policy`) in place toward `teacher`; one metrics dict a step."""

    cfg: DistillConfig
    score_name = "reverse_kl"

    def __init__(
        self,
        policy: nn.Module,
        teacher: nn.Module,
        tokenizer,
        rows: Sequence[dict],
        cfg: DistillConfig,
        *,
        chat_template=None,
        eos_token_ids: Sequence[int] | None = None,
        rollouts: RolloutBackend | None = None,
    ) -> None:
        if teacher.cfg.vocab_size != policy.cfg.vocab_size:
            raise ConfigError(
                f"distill.teacher: vocabulary of {teacher.cfg.vocab_size} tokens, the student's "
                f"has {policy.cfg.vocab_size}; distillation needs the same tokenizer"
            )
        super().__init__(
            policy,
            tokenizer,
            rows,
            cfg,
            chat_template=chat_template,
            eos_token_ids=eos_token_ids,
            rollouts=rollouts,
        )
        self.teacher = teacher.eval().requires_grad_(False)
        self.teacher_rows = 0  # completions this rank's teacher has scored, all steps together

    def step(self, step: int) -> dict:
        cfg, started = self.cfg, time.perf_counter()
        rollouts = self.sample(self.next_prompts(), cfg.group_size, step)
        rollout_s = time.perf_counter() - started
        train_started = time.perf_counter()
        m = {"step": step + 1, **self._update(rollouts)}
        train_s = time.perf_counter() - train_started
        m.update(self.refit())
        generated = sum(len(r.completion_ids) for r in rollouts)
        m["completion_len"] = generated / len(rollouts)
        m["rollout_tokens_per_s"] = generated / max(rollout_s, 1e-9)
        m["train_tokens_per_s"] = sum(
            len(r.prompt_ids) + len(r.completion_ids) for r in rollouts
        ) / max(train_s, 1e-9)
        m["rollout_share"] = rollout_s / max(time.perf_counter() - started, 1e-9)
        m["step_s"] = time.perf_counter() - started
        self.metrics.append(m)
        return m

    def _divergences(self, rollouts: list[Rollout]):
        """(the student's logits, the per-token loss, the per-token reverse KL) of `rollouts`."""
        prompts = [r.prompt_ids for r in rollouts]
        completions = [r.completion_ids for r in rollouts]
        student = completion_logits(self.policy, prompts, completions)
        with torch.no_grad():
            teacher = completion_logits(self.teacher, prompts, completions).logits
        self.teacher_rows += len(rollouts)
        per_token = token_divergence(
            student.logits,
            teacher,
            self.cfg.divergence,
            jsd_beta=self.cfg.jsd_beta,
            temperature=self.cfg.temperature,
        )
        with torch.no_grad():
            reverse = token_divergence(
                student.logits.detach(), teacher, "reverse_kl", temperature=self.cfg.temperature
            )
        return student, per_token, reverse

    def _share(self, rollouts: list[Rollout]) -> tuple[BatchSplit, list[Rollout]]:
        """The split in force for this batch and this rank's share of it (the whole batch in
        one process, or when there are fewer completions than ranks)."""
        split = self.split if self.split.active(len(rollouts)) else BatchSplit()
        lo, hi = split.bounds(len(rollouts))
        return split, rollouts[lo:hi]

    def _update(self, rollouts: list[Rollout]) -> dict:
        """One update on the batch; under a data-parallel layout each rank takes its share and
        every figure returned is the whole batch's."""
        if not any(r.completion_ids for r in rollouts):  # the same batch on every rank
            return {"loss": 0.0, "reverse_kl": 0.0, "grad_norm": 0.0}
        split, rollouts = self._share(rollouts)
        student, per_token, reverse = self._divergences(rollouts)
        tokens = per_token.numel()  # a share may have none: it still joins FSDP2's collectives
        loss = per_token.mean() if tokens else per_token.sum()  # every token weighs the same
        if split.size > 1:
            # this rank's tokens' share of the batch's mean; FSDP2 averages the ranks'
            # gradients, so a share weighted x ranks sums to the whole batch's gradient
            loss = loss * (split.size * tokens / max(split.total(float(tokens)), 1.0))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = self.clip_grads([p for p in self.policy.parameters() if p.requires_grad])
        self.optimizer.step()
        # the engine's sampling log-probs against the trainer's, as GRPO reports them
        engine = torch.tensor([lp for r in rollouts for lp in r.logprobs], dtype=torch.float64)
        diff = engine  # none when this share has no tokens
        if tokens:
            trainer = token_logprobs(student.logits.detach(), student.targets, self.cfg.temperature)
            diff = (engine - trainer).abs()
        return {
            "loss": split.total(float(loss.detach()) / split.size),
            "reverse_kl": split.mean(_mean(reverse), tokens),
            "grad_norm": float(grad_norm),
            "logprob_mismatch_mean": split.mean(_mean(diff), tokens),
            "logprob_mismatch_max": split.maximum(float(diff.max()) if tokens else 0.0),
            # the most completions one rank's teacher scored: the batch in one process, a
            # rank's share under dp_shard
            "teacher_rows_per_rank": split.maximum(float(len(rollouts))),
        }

    @torch.no_grad()
    def evaluate(self, rows: Sequence[dict]) -> float:
        """Mean per-token reverse KL to the teacher on the student's completions of `rows`,
        sampled as in training with a fixed seed (the same completions' seeds every call)."""
        ids = [self.encode(self.render(r)) for r in rows]
        rollouts = self.rollouts.generate(
            ids, 1, self.params, seed=self.cfg.seed + EVAL_SEED_OFFSET
        )
        rollouts = [r for r in rollouts if r.completion_ids]
        if not rollouts:
            return 0.0
        split, rollouts = self._share(rollouts)  # each rank's teacher scores its share
        _, _, reverse = self._divergences(rollouts)
        return split.mean(_mean(reverse), reverse.numel())


def _mean(values: torch.Tensor) -> float:
    """The mean of `values`, 0 for none (a rank's share without tokens)."""
    return float(values.mean()) if values.numel() else 0.0


def format_distill_step(m: dict) -> str:
    """The console's one line per distillation step."""
    parts = [
        f"step {m['step']}",
        f"loss {m['loss']:.4f}",
        f"reverse-kl {m['reverse_kl']:.4f}",
        f"len {m['completion_len']:.1f}",
        f"lp-mismatch {m.get('logprob_mismatch_max', 0.0):.1e}",
        f"rollout {m['rollout_tokens_per_s']:.0f} tok/s",
        f"train {m['train_tokens_per_s']:.0f} tok/s",
        f"refit {m['refit_s']:.3f}s",
    ]
    return " | ".join(parts)
