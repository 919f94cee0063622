"""DistillConfig: on-policy distillation's options (the student samples, the teacher scores every
sampled position); the sampling, optimizer, LoRA and rollout fields are every on-policy loop's."""

from __future__ import annotations

from pydantic import Field

from kiln.training.config import ParallelConfig
from kiln.training.post.divergence import Divergence
from kiln.training.rl.config import PARALLEL_HELP, OnPolicyConfig


class DistillConfig(OnPolicyConfig):
    divergence: Divergence = Field(
        "reverse_kl",
        description="Per-token loss over the vocabulary: reverse_kl KL(student||teacher), "
        "forward_kl KL(teacher||student), or jsd (generalised Jensen-Shannon, jsd_beta).",
    )
    jsd_beta: float = Field(
        0.5, gt=0, lt=1, description="jsd's mixture weight of the teacher (TRL GKD's beta)."
    )
    group_size: int = Field(1, ge=1, description="Completions sampled per prompt.")


class DistillRunConfig(DistillConfig):
    """DistillConfig plus what a run reads: the student, the teacher and the prompts."""

    base: str | None = Field(
        None, description="The student's start: an ExportedModel, HF folder or kiln checkpoint."
    )
    teacher: str | None = Field(
        None,
        description="The teacher: any model kiln reads (checkpoint, HF folder, export) with the "
        "student's tokenizer.",
    )
    prompts: str | None = Field(None, description="Prompt rows: a .jsonl or .parquet file.")
    chat_template: str | None = Field(
        None,
        description="A built-in template name or a tokenizer folder (default: the student's "
        "own, if it has one).",
    )
    eval_prompts: str | None = Field(
        None,
        description="Held-out prompt rows: the mean per-token reverse KL to the teacher on "
        "sampled completions (fixed seed), before and after training.",
    )
    eval_limit: int = Field(64, ge=1, description="Score at most this many held-out rows.")
    parallel: ParallelConfig | None = Field(
        None, description=PARALLEL_HELP.format(entry="the student laid out; the teacher whole")
    )
