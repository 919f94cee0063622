"""What every loop that samples from the policy it trains shares: prompts rendered and
encoded once, the rollout engines (in this process or on Ray actors), LoRA or full fine-tuning,
the optimizer, the prompt order, and the refit after each update (timed, and on Ray checked by
a checksum of every engine's weights against the trainer's)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from torch import nn

from kiln.engine.sampler import SamplingParams
from kiln.model.lora import apply_lora
from kiln.platform.errors import InputError, KilnError
from kiln.text.tokenizer import end_of_text_ids
from kiln.training.optimizer import build_optimizer
from kiln.training.rl.config import OnPolicyConfig
from kiln.training.rl.prompts import render_prompt
from kiln.training.rl.refit import merged_policy_state, state_checksum
from kiln.training.rl.rollout import Rollout
from kiln.training.rl.rollouts import open_rollouts

SEEDS_PER_STEP = 1 << 20  # completion seeds of step k: seed + k * SEEDS_PER_STEP + index


class RefitMismatch(KilnError):
    """A rollout engine's weights differ from the trainer's after a refit."""


class OnPolicyLoop:
    """`run()` trains `policy` in place, `step(k)` is the subclass's; `metrics` holds one dict
    per step. Call `close()` when done (it stops Ray rollout actors)."""

    def __init__(
        self,
        policy: nn.Module,
        tokenizer,
        rows: Sequence[dict],
        cfg: OnPolicyConfig,
        *,
        chat_template=None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.rows = list(rows)
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.eos_token_ids = list(
            eos_token_ids if eos_token_ids is not None else end_of_text_ids(tokenizer)
        )
        self.prompts = [self.render(r) for r in self.rows]
        self.prompt_ids = [self.encode(p) for p in self.prompts]
        self.rollouts = open_rollouts(cfg, policy, tokenizer, self.eos_token_ids)
        if cfg.lora is not None:
            apply_lora(policy, cfg.lora)
        self.policy = policy.train()
        self.optimizer = build_optimizer(policy, cfg.optimizer)
        self.params = SamplingParams(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p
        )
        self.metrics: list[dict] = []
        self._order: list[int] = []
        self._rng = random.Random(cfg.seed)

    def step(self, step: int) -> dict:
        raise NotImplementedError

    def run(self, on_step: Callable[[dict], None] | None = None) -> list[dict]:
        for step in range(len(self.metrics), self.cfg.steps):
            m = self.step(step)
            if on_step is not None:
                on_step(m)
        return self.metrics

    def close(self) -> None:
        self.rollouts.close()

    # -- prompts ------------------------------------------------------------------------------

    def render(self, row: dict) -> str:
        return render_prompt(row, self.chat_template, self.cfg.prompt_format)

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt; an empty one starts from the end-of-text token."""
        ids = self.tokenizer.encode(text).ids
        if ids:
            return ids
        if not self.eos_token_ids:
            raise InputError("a prompt is empty and the tokenizer has no end-of-text token")
        return [min(self.eos_token_ids)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def next_prompts(self) -> list[int]:
        """The next `prompts_per_step` rows, a seeded shuffle of all rows per epoch."""
        picked = []
        while len(picked) < self.cfg.prompts_per_step:
            if not self._order:
                self._order = list(range(len(self.rows)))
                self._rng.shuffle(self._order)
            picked.append(self._order.pop())
        return picked

    def sample(self, picked: list[int], group_size: int, step: int) -> list[Rollout]:
        return self.rollouts.generate(
            [self.prompt_ids[i] for i in picked],
            group_size,
            self.params,
            seed=self.cfg.seed + step * SEEDS_PER_STEP,
        )

    def greedy(self, rows: Sequence[dict]) -> tuple[list[str], list[Rollout]]:
        """Each row's rendered prompt and its greedy completion under the engines' weights."""
        prompts = [self.render(r) for r in rows]
        params = self.params.model_copy(update={"temperature": 0.0})
        ids = [self.encode(p) for p in prompts]
        return prompts, self.rollouts.generate(ids, 1, params, seed=self.cfg.seed)

    # -- refit --------------------------------------------------------------------------------

    def refit(self) -> dict:
        """The updated policy's weights into every rollout engine: seconds, replaced actors."""
        state = merged_policy_state(self.policy)
        m = {"refit_s": self.rollouts.refit(state)}
        if self.cfg.rollout.workers and self.cfg.rollout.verify_refit:
            if not self.engines_match(state):
                raise RefitMismatch("a rollout actor's weights differ from the trainer's")
            m["refit_verified"] = 1.0
        m["rollout_restarts"] = float(self.rollouts.restarts)
        return m

    def engines_match(self, state: dict | None = None) -> bool:
        """Every engine's weight checksum equals the trainer's (LoRA merged)."""
        state = merged_policy_state(self.policy) if state is None else state
        trainer = state_checksum(state, self.rollouts.engine_names())
        return all(c == trainer for c in self.rollouts.checksums())
