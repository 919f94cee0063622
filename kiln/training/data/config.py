"""Where training batches come from. Owned by the tokens area; the trainer only reads it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paths: list[str] = Field(
        default_factory=list,
        description="Indexed-dataset prefixes (<prefix>.bin/.idx) or TokenDataset artifact directories.",
    )
    weights: list[float] | None = Field(None, description="Blend weights, one per path (default: equal).")
    split: str = Field("train", description="Which split of a TokenDataset artifact to read.")
    synthetic: bool = Field(False, description="Random tokens instead of a dataset (benchmarks, smoke tests).")
    seed: int = Field(1234, description="Shuffle seed.")
    prefetch: int = Field(2, description="Batches assembled ahead in a background thread.")
