"""Checkpoint settings. Owned by the checkpoint area; the trainer only reads it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CheckpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    dir: str | None = Field(
        None, description="Checkpoint root (local path or fsspec URI); None disables."
    )
    interval_steps: int = Field(0, ge=0, description="Save every N steps (0: only at the end).")
    interval_minutes: float | None = Field(
        None, gt=0, description="Also save when this much time passed."
    )
    async_save: bool = Field(
        False, alias="async", description="Write in the background while training goes on."
    )
    keep_last: int = Field(3, ge=1, description="Keep the newest N complete checkpoints.")
    load_from: str | None = Field(
        None, description="Start from this checkpoint instead of the latest in dir."
    )
    init_from: str | None = Field(
        None,
        description="Continue pretraining from these weights (a checkpoint root or step folder, "
        "e.g. `kiln import-hf` output): a fresh run starts from them; once `dir` holds a "
        "checkpoint, resuming wins.",
    )
    save_final: bool = Field(True, description="Always save after the last training step.")
    last_save_model_only: bool = Field(
        False,
        description="The save after the last step holds no optimizer state (torchtitan's name): "
        "about 1/3 of an AdamW checkpoint, for export. Resuming from it continues the step "
        "count and data position with a fresh optimizer.",
    )
    load_optimizer: bool = Field(
        True,
        description="Restore optimizer, schedulers, data position and step "
        "(False: weights only, a fresh run).",
    )
    thread_count: int = Field(1, ge=1, description="Writer threads per rank.")
