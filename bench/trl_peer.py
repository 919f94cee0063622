"""TRL's GRPOTrainer as Kiln's peer, run by bench/rl.py and tests/training/rl/test_trl_peer.py
with the Python of a separate venv: TRL 1.x needs datasets >= 5.1 (pyarrow 23+, numpy 2), which
this project's pins exclude. It imports no kiln. The venv (KILN_TRLVENV, default /tmp/trlvenv):

    python3.11 -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch==2.13.0 \
        && /tmp/trlvenv/bin/pip install torch==2.13.0 trl==1.16.0

(torch pinned first and again, so pip keeps the CPU wheel rather than pulling a CUDA one.)

    grpo MODEL_DIR PROMPTS.jsonl --steps N ...   GRPOTrainer with its own generation
        (transformers `generate`, no vLLM) on an HF folder. It talks to its parent over stdin and
        stdout, one line per message, ours prefixed with `KILN `: before each step it says
        {"ready": step, "cpu_s": CPU seconds of the last step from its `go`, "idle_cpu_s": those
        spent waiting for that `go`} and waits for `go` (the parent interleaves TRL's steps with
        Kiln's);
        the reward of each completion it asks of the parent ({"reward": [...]}, answered with a
        JSON list), which scores with Kiln's own RewardSet; after each step it says {"step": ...}
        (seconds, generation seconds, generated tokens, mean reward).
    loss IN.pt OUT.pt   GRPOTrainer._compute_loss on the log-probs, advantages and masks of
        IN.pt, once per case (a real GRPOConfig each); writes each case's loss and its gradient
        with respect to the policy log-probs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

PREFIX = "KILN "


def _say(message: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def _hear() -> str:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("parent closed the pipe")
    return line.strip()


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that times its generation and counts the tokens it generates."""

    generation_s = 0.0
    generated_tokens = 0

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        started = time.perf_counter()
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        self.generation_s += time.perf_counter() - started
        self.generated_tokens += sum(len(c) for c in completion_ids)
        return completion_ids, logprobs


class Lockstep(TrainerCallback):
    """Waits for the parent's `go` before each step and reports the step after it."""

    def __init__(self) -> None:
        self.trainer: TimedGRPOTrainer | None = None
        self.rewards: list[float] = []

    go_cpu: float | None = None  # process CPU time when the last `go` came
    idle_cpu = 0.0  # CPU time spent waiting for that `go` (the parent's other side stepping)

    def turn_figures(self) -> dict:
        """CPU seconds of the step since the last `go`, and of the wait before it."""
        step = time.process_time() - self.go_cpu if self.go_cpu is not None else 0.0
        return {"cpu_s": step, "idle_cpu_s": self.idle_cpu}

    def on_step_begin(self, args, state, control, **kwargs):
        waiting = time.process_time()
        _say({"ready": state.global_step, **self.turn_figures()})
        if _hear() != "go":
            raise SystemExit("expected `go`")
        self.go_cpu = time.process_time()
        self.idle_cpu = self.go_cpu - waiting
        self.trainer.generation_s, self.trainer.generated_tokens = 0.0, 0
        self.rewards, self.started = [], time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_s = time.perf_counter() - self.started
        _say({"step": {"step": state.global_step, "step_s": step_s,
                       "generation_s": self.trainer.generation_s,
                       "generated_tokens": self.trainer.generated_tokens,
                       "reward": sum(self.rewards) / max(len(self.rewards), 1)}})  # fmt: skip


def _text(x) -> str:
    """A prompt or completion as text: standard format is a string, conversational a list (its
    last message: a chat prompt reaches the reward as the user's words, not the rendered
    template Kiln's loop passes; math_exact reads only the completion)."""
    return x if isinstance(x, str) else x[-1]["content"]


def _parent_reward(lockstep: Lockstep):
    def math_exact(prompts, completions, **columns):
        fields = [k for k in columns if k not in ("trainer_state", "log_extra", "log_metric",
                                                  "completion_ids")]  # fmt: skip
        items = [{"prompt": _text(p), "completion": _text(c),
                  "row": {k: columns[k][i] for k in fields}}
                 for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]  # fmt: skip
        _say({"reward": items})
        rewards = json.loads(_hear())
        lockstep.rewards.extend(rewards)
        return rewards

    return math_exact


def _rows(path: str, conversational: bool) -> Dataset:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if conversational:  # TRL renders a conversational prompt with the model's chat template
        rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    return Dataset.from_list(rows)


def _config(out: str, **overrides) -> GRPOConfig:
    fields = {
        "output_dir": out,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "lr_scheduler_type": "constant",  # Kiln's GRPO: AdamW, constant lr, no warmup
        "warmup_steps": 0,
        "adam_beta2": 0.95,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "gradient_accumulation_steps": 1,
        # TRL 1.x checkpoints activations by default; Kiln's GRPO keeps them: the same work
        "gradient_checkpointing": False,
        "dataloader_num_workers": 0,
        # TRL's configs default to bf16 mixed precision (base_config.py: bf16 = not fp16), which
        # on CPU autocasts the policy's forwards to bf16; Kiln's GRPO computes in fp32: the same
        "bf16": False,
    }
    return GRPOConfig(**{**fields, **overrides})


def grpo(args) -> None:
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows = _rows(args.prompts, conversational=bool(tok.chat_template))
    lockstep = Lockstep()
    with tempfile.TemporaryDirectory() as out:
        cfg = _config(
            out,
            max_steps=args.steps,
            per_device_train_batch_size=args.prompts_per_step * args.group_size,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            learning_rate=args.lr,
            temperature=1.0,
            top_p=1.0,
            beta=0.0,
            loss_type="bnpo",  # Kiln's `token` aggregation
            seed=args.seed,
        )
        trainer = TimedGRPOTrainer(model=model, reward_funcs=_parent_reward(lockstep), args=cfg,
                                   train_dataset=rows, processing_class=tok,
                                   callbacks=[lockstep])  # fmt: skip
        lockstep.trainer = trainer
        trainer.train()
    _say({"done": True, **lockstep.turn_figures()})


def loss(args) -> None:
    """Each case's loss and d loss / d logp from GRPOTrainer._compute_loss, fed our tensors in
    place of its forward (`_get_per_token_logps_and_entropies`)."""
    batch = torch.load(args.inputs)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows = Dataset.from_list([{"prompt": "1 + 1 ="}] * 4)
    mask = batch["mask"]
    results = []
    with tempfile.TemporaryDirectory() as out:
        for case in batch["cases"]:
            cfg = _config(
                out,
                per_device_train_batch_size=mask.shape[0],
                num_generations=batch["group_size"],
                max_completion_length=case["max_completion_length"],
                beta=case["beta"],
                epsilon=case["epsilon_low"],
                epsilon_high=case["epsilon_high"],
                loss_type=case["loss_type"],
                importance_sampling_level=case["importance_sampling_level"],
                use_bias_correction_kl=case["use_bias_correction_kl"],
            )
            trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(
                completions), args=cfg, train_dataset=rows, processing_class=tok)  # fmt: skip
            trainer.current_gradient_accumulation_steps = 1  # set by train(); one batch here
            logp = batch["logp"].clone().requires_grad_()
            trainer._get_per_token_logps_and_entropies = lambda *a, _lp=logp, **k: (
                _lp, torch.zeros_like(_lp), None)  # fmt: skip
            inputs = {
                "prompt_ids": torch.zeros(mask.shape[0], 1, dtype=torch.long),
                "prompt_mask": torch.ones(mask.shape[0], 1, dtype=torch.long),
                "completion_ids": torch.zeros(mask.shape, dtype=torch.long),
                "completion_mask": mask,
                "advantages": batch["advantages"],
                "old_per_token_logps": batch["old"],
                "ref_per_token_logps": batch["ref"],
            }
            if case.get("tis") is not None:
                # TRL weights tokens by its sampler-vs-trainer ratio only in vLLM mode: take
                # that branch of _compute_loss with the ratio given (no vLLM is involved)
                trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
                inputs["importance_sampling_ratio"] = case["tis"]
            trainer.model.train()
            value = trainer._compute_loss(trainer.model, inputs)
            value.backward()
            results.append({"loss": value.detach(), "grad": logp.grad.detach()})
    torch.save(results, args.outputs)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("grpo")
    g.add_argument("model")
    g.add_argument("prompts")
    g.add_argument("--steps", type=int, required=True)
    g.add_argument("--group-size", type=int, required=True)
    g.add_argument("--prompts-per-step", type=int, required=True)
    g.add_argument("--max-new-tokens", type=int, required=True)
    g.add_argument("--lr", type=float, required=True)
    g.add_argument("--threads", type=int, required=True)
    g.add_argument("--seed", type=int, default=0)
    lo = sub.add_parser("loss")
    lo.add_argument("model")
    lo.add_argument("inputs")
    lo.add_argument("outputs")
    args = ap.parse_args()
    grpo(args) if args.mode == "grpo" else loss(args)


if __name__ == "__main__":
    main()
