"""Where training batches come from. Owned by the tokens area; the trainer only reads it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paths: list[str] = Field(
        default_factory=list,
        description="Indexed-dataset prefixes (<prefix>.bin/.idx) "
        "or TokenDataset artifact directories.",
    )
    weights: list[float] | None = Field(
        None, description="Blend weights, one per path (default: equal)."
    )
    split: str = Field("train", description="Which split of a TokenDataset artifact to read.")
    synthetic: bool = Field(
        False, description="Random tokens instead of a dataset (benchmarks, smoke tests)."
    )
    seed: int | None = Field(None, description="Shuffle seed (default: the trainer's seed).")
    prefetch: int = Field(
        2, ge=0, description="Batches assembled ahead in a background thread (0: none)."
    )
    index_cache_dir: str | None = Field(
        None,
        description="Where document/sample/shuffle indices are cached "
        "(default: $KILN_CACHE_DIR/gpt_index).",
    )

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.weights is not None:
            if len(self.weights) != len(self.paths):
                raise ValueError(f"weights: {len(self.weights)} given for {len(self.paths)} paths")
            if any(w <= 0 for w in self.weights):
                raise ValueError("weights: every weight must be > 0")
        return self
