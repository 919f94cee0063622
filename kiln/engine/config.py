"""How many sequences the engine decodes at once and how much prompt it prefills per step: the
`batching` options of every stage that starts an endpoint (serve, evaluate)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BatchingConfig(BaseModel):
    """How the local backend batches concurrent prompts: continuously (kiln.engine: rows join
    and leave the running batch at every decoding step, in max_batch_size KV-cache slots)."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(8, ge=1, description="KV-cache slots: sequences decoded at once")
    prefill_chunk: int = Field(
        256, ge=1, description="prompt tokens prefilled per step (long prompts chunked)"
    )
