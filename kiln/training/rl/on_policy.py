"""What every loop that samples from the policy it trains shares: prompts rendered and
encoded once, the rollout engines (in this process or on Ray actors), LoRA or full fine-tuning,
the optimizer, the prompt order, the refit after each update (timed, and on Ray checked by a
checksum of every engine's weights against the trainer's), and the state a run resumes from.

Resuming is exact: a step's completions are seeded by the step number, the prompt order by a
saved RNG, and the policy and AdamW state are restored bit for bit, so on CPU a resumed run
repeats the rewards and losses an uninterrupted one gets (tests/training/rl/test_resume.py).

Sampling ahead (`lag` > 0, GRPO's `max_policy_lag`): a step submits the batches of the next
`lag` steps before it trains, so the engines sample them with the weights they hold while the
trainer trains; a batch is then used `lag` updates after the weights that sampled it (each
rollout says which: `policy_version`, the number of updates its engine had seen). A saved state
keeps the batches already sampled ahead, so a resumed run uses the same ones."""

from __future__ import annotations

import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from kiln.engine.sampler import SamplingParams
from kiln.model.attention import set_attention_backend
from kiln.model.lora import apply_lora
from kiln.platform.errors import InputError, KilnError
from kiln.text.tokenizer import end_of_text_ids
from kiln.training.optimizer import build_optimizer, clip_grads_, global_grad_norm
from kiln.training.rl.batch_split import BatchSplit
from kiln.training.rl.config import OnPolicyConfig
from kiln.training.rl.loop_state import PlainState
from kiln.training.rl.prompts import render_prompt
from kiln.training.rl.refit import merged_policy_state, state_checksum
from kiln.training.rl.rollout import Rollout, RolloutBackend
from kiln.training.rl.rollouts import open_rollouts

SEEDS_PER_STEP = 1 << 20  # completion seeds of step k: seed + k * SEEDS_PER_STEP + index


class RefitMismatch(KilnError):
    """A rollout engine's weights differ from the trainer's after a refit."""


@dataclass
class Batch:
    """A step's prompts (row indices) and its rollouts: `pending` is the engines' handle until
    they are collected into `rollouts`."""

    step: int
    picked: list[int]
    pending: object = None
    rollouts: list[Rollout] | None = None


class OnPolicyLoop:
    """`run()` trains `policy` in place, `step(k)` is the subclass's; `metrics` holds one dict
    per step. Call `close()` when done (it stops Ray rollout actors)."""

    score_name = "reward"  # the per-step metric `evaluate` measures on held-out prompts
    lag = 0  # steps sampled ahead of the one training (GRPO: max_policy_lag)

    def __init__(
        self,
        policy: nn.Module,
        tokenizer,
        rows: Sequence[dict],
        cfg: OnPolicyConfig,
        *,
        chat_template=None,
        eos_token_ids: Sequence[int] | None = None,
        rollouts: RolloutBackend | None = None,
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
        if cfg.rollout.batch_invariant:  # before the engines copy the policy or its config
            set_attention_backend(policy, "invariant")
        # `rollouts`: engines opened by the caller (a laid-out run's, shared over its ranks)
        self.rollouts = rollouts or open_rollouts(cfg, policy, tokenizer, self.eos_token_ids)
        if cfg.lora is not None:  # adapters drawn from the run's seed: a run repeats
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                apply_lora(policy, cfg.lora)
        self.policy = policy.train()
        self.optimizer = build_optimizer(policy, cfg.optimizer)
        self.trainer_state = PlainState()  # a laid-out policy's is gathered (layouts.py)
        self.split = BatchSplit()  # one process: the whole batch (layouts.py sets the ranks')
        self.params = SamplingParams(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p
        )
        self.metrics: list[dict] = []
        self.policy_version = 0  # updates the policy has taken (each one refits the engines)
        self._order: list[int] = []
        self._rng = random.Random(cfg.seed)
        self._ahead: deque[Batch] = deque()  # submitted, not yet trained on, in step order

    def step(self, step: int) -> dict:
        raise NotImplementedError

    def run(
        self, on_step: Callable[[dict], None] | None = None, state_file: str | None = None
    ) -> list[dict]:
        """Steps from the first not yet taken to `steps`; with `state_file` and
        `checkpoint_interval`, the loop's state saved there every that many steps."""
        interval = self.cfg.checkpoint_interval
        for step in range(len(self.metrics), self.cfg.steps):
            m = self.step(step)
            if state_file and interval and (step + 1) % interval == 0:
                self.save(state_file)
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

    def take_batch(self, step: int, group_size: int) -> tuple[list[int], list[Rollout]]:
        """Step `step`'s prompts and rollouts, after submitting the batches of every step up to
        `step + lag` not yet submitted (each draws its prompts in step order, so at lag 0 this
        is `sample(next_prompts())`)."""
        submitted = self._ahead[-1].step + 1 if self._ahead else step
        for ahead in range(submitted, min(step + self.lag, self.cfg.steps - 1) + 1):
            picked = self.next_prompts()
            pending = self.rollouts.submit(
                [self.prompt_ids[i] for i in picked],
                group_size,
                self.params,
                seed=self.cfg.seed + ahead * SEEDS_PER_STEP,
            )
            self._ahead.append(Batch(ahead, picked, pending))
        batch = self._ahead.popleft()
        if batch.step != step:
            raise KilnError(f"sampled ahead for step {batch.step + 1}, training step {step + 1}")
        return batch.picked, self._collect(batch)

    def _collect(self, batch: Batch) -> list[Rollout]:
        if batch.rollouts is None:
            batch.rollouts, batch.pending = self.rollouts.wait(batch.pending), None
        return batch.rollouts

    def greedy(self, rows: Sequence[dict]) -> tuple[list[str], list[Rollout]]:
        """Each row's rendered prompt and its greedy completion under the engines' weights."""
        prompts = [self.render(r) for r in rows]
        params = self.params.model_copy(update={"temperature": 0.0})
        ids = [self.encode(p) for p in prompts]
        return prompts, self.rollouts.generate(ids, 1, params, seed=self.cfg.seed)

    # -- resume -------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything the next step depends on: the policy (adapters included), the optimizer,
        the prompt order and its RNG, the metrics so far (their count is the next step)."""
        policy, optimizer = self.trainer_state.get(self.policy, self.optimizer)
        return {
            "policy": policy,
            "optimizer": optimizer,
            "order": list(self._order),
            "rng": self._rng.getstate(),
            "metrics": self.metrics,
            "policy_version": self.policy_version,
            # batches sampled ahead: they were drawn from the weights before this state's
            "ahead": [
                {
                    "step": b.step,
                    "picked": b.picked,
                    "rollouts": [asdict(r) for r in self._collect(b)],
                }
                for b in self._ahead
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        self.trainer_state.set(self.policy, self.optimizer, state["policy"], state["optimizer"])
        self._order = list(state["order"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self.metrics = list(state["metrics"])
        self.policy_version = state.get("policy_version", len(self.metrics))
        self._ahead = deque(
            Batch(b["step"], list(b["picked"]), rollouts=[Rollout(**r) for r in b["rollouts"]])
            for b in state.get("ahead", [])
        )
        self.rollouts.refit(merged_policy_state(self.policy), self.policy_version)

    def save(self, path: str) -> None:
        """The state to `path`, replaced atomically (a crash mid-write keeps the last one)."""
        state = self.state_dict()
        if not self.trainer_state.writes:  # a laid-out run: rank 0 writes the gathered state
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    def resume(self, path: str) -> bool:
        """Load the state at `path` if there is one; True when it did."""
        if not os.path.isfile(path):
            return False
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return True

    # -- updates ------------------------------------------------------------------------------

    def clip_grads(self, params: list[nn.Parameter]) -> torch.Tensor:
        """The gradients' global norm, clipped to `optimizer.grad_clip` when set. A policy laid
        out over ranks (layouts.py: DTensor gradients) takes the trainer's norm, reduced over
        each mesh; a plain one torch's. List `params` before a forward: FSDP2 swaps its root's
        unsharded parameters in until the backward, and the gradients land on the sharded."""
        clip = self.cfg.optimizer.grad_clip
        if any(isinstance(p, DTensor) for p in params):
            norm = global_grad_norm(params)
            if clip:
                clip_grads_(params, clip, norm)
            return norm
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        # torch scales by min(1, clip / (norm + 1e-6)): a pass over every gradient even when the
        # factor is 1, which leaves them as they are (bit for bit), so only a clip scales
        if clip and bool(clip / (norm + 1e-6) < 1.0):  # torch's factor, in its dtype
            torch.nn.utils.clip_grads_with_norm_(params, clip, norm)
        return norm

    # -- refit --------------------------------------------------------------------------------

    def refit(self) -> dict:
        """The updated policy's weights into every rollout engine: seconds, replaced actors.
        The seconds count the LoRA merge and, under a layout, the gather of the shards (a
        collective: the ranks finish it together) as well as the engines' load."""
        started = time.perf_counter()
        state = merged_policy_state(self.policy)
        gathered_s = time.perf_counter() - started
        self.policy_version += 1
        m = {"refit_s": gathered_s + self.rollouts.refit(state, self.policy_version)}
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
