"""A GRPO run from a config: read the model and prompts, train, write a Checkpoint (weights,
LoRA merged, plus the tokenizer files) that `export` and `Generator.load` read, and `run.json`
with every step's metrics. The reading and writing helpers serve `distill` too."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable

import torch.distributed as dist
from torch import nn

from kiln.model.formats.weights import build_model, read_weights, write_model_checkpoint
from kiln.platform.config import load_body, override_paths, validate
from kiln.platform.errors import ConfigError, InputError, KilnError
from kiln.text.chat_template import ChatTemplate
from kiln.text.tokenizer import TOKENIZER_FILES, end_of_text_ids, find_tokenizer
from kiln.training.launch import init_process_group_from_env
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.grpo import GRPO, format_step
from kiln.training.rl.layouts import lay_out_run, require_ranks
from kiln.training.rl.on_policy import OnPolicyLoop
from kiln.training.rl.prompts import load_prompts
from kiln.training.rl.rank_rollouts import open_shared_rollouts
from kiln.training.rl.refit import merged_policy_state

RUN_FILE = "run.json"
RESUME_DIR, STATE_FILE = "resume", "loop_state.pt"
log = logging.getLogger("kiln.training.rl")


def within_block(block: str):
    """A `--set` route that takes `grpo.steps=3` as `steps=3`: the field names errors print
    (and `kiln run`'s stage overrides) work on the command line too."""

    def route(parts: list) -> list:
        return parts[1:] if len(parts) > 1 and parts[0] == block else parts

    return route


def load_config(path: str, overrides: list[str] | None = None) -> GRPORunConfig:
    """A GRPORunConfig from YAML (a `grpo:` block or the fields) with KEY=VALUE overrides."""
    route = within_block("grpo")
    body = load_body(path, block="grpo", overrides=overrides or [], route=route)
    blame = override_paths(overrides or [], route)
    return validate(GRPORunConfig, body, prefix="grpo", source=path, overrides=blame)


def chat_template(spec: str | None, tok_dir: str | None) -> ChatTemplate | None:
    if spec is not None:
        return ChatTemplate.resolve(spec)
    if tok_dir is None:
        return None
    try:
        return ChatTemplate.from_pretrained(tok_dir)
    except InputError:  # a base model without a template: prompts are used verbatim
        return None


def load_policy(base: str) -> tuple[nn.Module, object, str | None]:
    """The model at `base` (checkpoint, HF folder, export), its tokenizer and tokenizer folder."""
    path, model_cfg, state = read_weights(base)
    tok, tok_dir = find_tokenizer(None, search=[path, os.path.dirname(path.rstrip("/"))])
    return build_model(model_cfg, state, device="cpu"), tok, tok_dir


def write_policy(out_dir: str, model_cfg, state: dict, tok_dir: str | None, step: int) -> None:
    """The policy's merged `state` as a Checkpoint, its tokenizer files beside the weights."""
    os.makedirs(out_dir, exist_ok=True)
    write_model_checkpoint(out_dir, model_cfg, state, step=step)
    for name in TOKENIZER_FILES:  # the tokenizer (and chat template) travel with the weights
        if tok_dir is not None and os.path.exists(os.path.join(tok_dir, name)):
            shutil.copyfile(os.path.join(tok_dir, name), os.path.join(out_dir, name))


def resume_state(loop: OnPolicyLoop, out_dir: str, state_dir: str | None) -> str | None:
    """The loop's state file (None without checkpoint_interval), loaded if it exists."""
    if not loop.cfg.checkpoint_interval:
        return None
    path = os.path.join(state_dir or os.path.join(out_dir, RESUME_DIR), STATE_FILE)
    if loop.resume(path):
        log.info("resumed from %s after step %d", path, len(loop.metrics))
    return path


def write_run(out_dir: str, cfg, summary: dict) -> None:
    with open(os.path.join(out_dir, RUN_FILE), "w") as f:
        json.dump({"config": cfg.model_dump(mode="json"), **summary}, f, indent=1)


def train_and_write(
    loop: OnPolicyLoop,
    cfg,
    out_dir: str,
    policy: nn.Module,
    tok_dir: str | None,
    on_step: Callable[[dict], None] | None,
    state_dir: str | None,
    started: float,
    main: bool = True,
) -> dict:
    """The held-out score of the base, the loop's steps (resumed from a saved state if one is
    there), the held-out score after; then the Checkpoint and run.json. The summary names the
    loop's score (`loop.score_name`: reward for GRPO, reverse_kl for distillation). Laid out
    over ranks, every rank trains and gathers the weights; only the `main` one writes."""
    score = loop.score_name
    held_out = load_prompts(cfg.eval_prompts)[: cfg.eval_limit] if cfg.eval_prompts else []
    try:
        before = loop.evaluate(held_out) if held_out else None  # the base's, also on resume
        state = resume_state(loop, out_dir, state_dir)
        train_started = time.perf_counter()
        metrics = loop.run(on_step, state_file=state)
        train_s = time.perf_counter() - train_started
        after = loop.evaluate(held_out) if held_out else None
    finally:
        loop.close()
    weights = merged_policy_state(policy)  # every rank: a gather when laid out
    if not main:
        return {"steps": len(metrics), "metrics": metrics}
    write_policy(out_dir, policy.cfg, weights, tok_dir, cfg.steps)
    summary = {
        "steps": len(metrics),
        f"first_{score}": metrics[0][score],
        "final": metrics[-1],
        f"eval_{score}_before": before,
        f"eval_{score}_after": after,
        "train_seconds": train_s,
        "steps_per_s": len(metrics) / max(train_s, 1e-9),
        "seconds": time.perf_counter() - started,
        "metrics": metrics,
    }
    write_run(out_dir, cfg, summary)
    if state is not None and state_dir is None:
        shutil.rmtree(os.path.dirname(state), ignore_errors=True)
    return summary


def run_grpo(
    cfg: GRPORunConfig,
    out_dir: str,
    on_step: Callable[[dict], None] | None = None,
    state_dir: str | None = None,
) -> dict:
    """Train and write the Checkpoint to `out_dir`. With `checkpoint_interval`, the loop's state
    goes to `state_dir` (default `<out_dir>/resume/`, removed once the run succeeds) and a run
    started again with the same folder resumes from it."""
    if cfg.base is None:
        raise ConfigError("grpo.base: name the model to train (an ExportedModel or checkpoint)")
    if cfg.prompts is None:
        raise ConfigError("grpo.prompts: name the prompt file (.jsonl or .parquet)")
    started = time.perf_counter()
    if cfg.parallel is not None:
        require_ranks("grpo.parallel")
    policy, tok, tok_dir = load_policy(cfg.base)
    eos = end_of_text_ids(tok, tok_dir)
    loop = GRPO(
        policy,
        tok,
        load_prompts(cfg.prompts),
        cfg,
        chat_template=chat_template(cfg.chat_template, tok_dir),
        eos_token_ids=eos,
        rollouts=None if cfg.parallel is None else open_shared_rollouts(cfg, policy, tok, eos),
    )
    main = True if cfg.parallel is None else lay_out_run(loop, cfg.parallel, "grpo.parallel")
    return train_and_write(
        loop, cfg, out_dir, policy, tok_dir, on_step if main else None, state_dir, started, main
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun (`parallel:` set): every rank runs the same config, rank 0
    prints each step and writes the Checkpoint and run.json."""
    parser = argparse.ArgumentParser(prog="python -m kiln.training.rl.run")
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", required=True, help="the Checkpoint folder to write")
    args = parser.parse_args(argv)
    joined = False  # a process group this entry point started is its to end
    try:
        cfg = load_config(args.config, args.overrides)
        if not dist.is_initialized():
            init_process_group_from_env("cpu", optimizer_offload=False)
            joined = dist.is_initialized()
        summary = run_grpo(cfg, args.out, on_step=lambda m: print(format_step(m), flush=True))
        if "final" in summary:
            print(json.dumps(summary["final"], default=str))
    except KilnError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if joined:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
