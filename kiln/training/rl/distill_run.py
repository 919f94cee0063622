"""An on-policy distillation run from a config: read the student, the teacher and the prompts,
train, write a Checkpoint (weights, LoRA merged, plus the tokenizer files) and `run.json` with
every step's metrics and the held-out reverse KL before and after."""

from __future__ import annotations

import time
from collections.abc import Callable

from kiln.platform.config import load_body, override_paths, validate
from kiln.platform.errors import ConfigError
from kiln.text.tokenizer import end_of_text_ids
from kiln.training.post.teacher import load_teacher
from kiln.training.rl.distill import OnPolicyDistill
from kiln.training.rl.distill_config import DistillRunConfig
from kiln.training.rl.layouts import lay_out_run, require_ranks
from kiln.training.rl.prompts import load_prompts
from kiln.training.rl.rank_rollouts import open_shared_rollouts
from kiln.training.rl.run import chat_template, load_policy, train_and_write, within_block


def load_distill_config(path: str, overrides: list[str] | None = None) -> DistillRunConfig:
    """A DistillRunConfig from YAML (a `distill:` block or the fields) with KEY=VALUE overrides."""
    route = within_block("distill")
    body = load_body(path, block="distill", overrides=overrides or [], route=route)
    blame = override_paths(overrides or [], route)
    return validate(DistillRunConfig, body, prefix="distill", source=path, overrides=blame)


def run_distill(
    cfg: DistillRunConfig,
    out_dir: str,
    on_step: Callable[[dict], None] | None = None,
    state_dir: str | None = None,
) -> dict:
    """Train and write the Checkpoint to `out_dir`. With `checkpoint_interval`, the loop's state
    goes to `state_dir` (default `<out_dir>/resume/`, removed once the run succeeds) and a run
    started again with the same folder resumes from it."""
    for field, what in (
        ("base", "the student (an ExportedModel, HF folder or checkpoint)"),
        ("teacher", "the teacher (a checkpoint, HF folder or export with the student's tokenizer)"),
        ("prompts", "the prompt file (.jsonl or .parquet)"),
    ):
        if getattr(cfg, field) is None:
            raise ConfigError(f"distill.{field}: name {what}")
    started = time.perf_counter()
    if cfg.parallel is not None:
        require_ranks("distill.parallel")
    student, tok, tok_dir = load_policy(cfg.base)
    teacher = load_teacher("distill.teacher", cfg.teacher, student.cfg.vocab_size, tok)
    eos = end_of_text_ids(tok, tok_dir)
    loop = OnPolicyDistill(
        student,
        teacher,
        tok,
        load_prompts(cfg.prompts),
        cfg,
        chat_template=chat_template(cfg.chat_template, tok_dir),
        eos_token_ids=eos,
        rollouts=None if cfg.parallel is None else open_shared_rollouts(cfg, student, tok, eos),
    )
    main = True if cfg.parallel is None else lay_out_run(loop, cfg.parallel, "distill.parallel")
    return train_and_write(
        loop, cfg, out_dir, student, tok_dir, on_step if main else None, state_dir, started, main
    )
