"""The `generate` pipeline stage: rows (a Corpus, or `input` JSONL/Parquet) and a model (`model`,
or an upstream Checkpoint) in; a Corpus of generations out. Finished batches are recorded in the
stage's work folder, so a killed run resumes with them kept."""

from __future__ import annotations

from typing import ClassVar

from kiln.curator.generate.config import GenerateConfig
from kiln.curator.generate.rows import files_signature, input_files
from kiln.curator.generate.run import generate, stream_needs
from kiln.platform.artifact import parquet_files
from kiln.platform.errors import ConfigError
from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageContext


class GenerateStage(Stage):
    """Batch inference and synthetic data: a prompt template per row on Kiln's engine."""

    type_name = "generate"
    Config = GenerateConfig
    input_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus", "model": "Checkpoint"}
    optional_inputs: ClassVar[frozenset[str]] = frozenset({"corpus", "model"})
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}

    def needs(self) -> Resources:
        return stream_needs(self.config)  # type: ignore[arg-type]

    def extra_fingerprint(self) -> str:
        """Input files' names, sizes and mtimes: a changed input invalidates the cache."""
        cfg: GenerateConfig = self.config  # type: ignore[assignment]
        return str(files_signature(input_files(cfg.input))) if cfg.input else ""

    def run(self, ctx: StageContext) -> dict:
        cfg: GenerateConfig = self.config  # type: ignore[assignment]
        update: dict = {}
        if "corpus" in ctx.inputs:
            update["input"] = [*cfg.input, *parquet_files(ctx.inputs["corpus"].path)]
        if "model" in ctx.inputs and not cfg.model:
            update["model"] = ctx.inputs["model"].path
        cfg = cfg.model_copy(update=update)
        if not cfg.input:
            raise ConfigError(f"{self.name}.input: expected JSONL or Parquet files (or a Corpus)")
        if not cfg.model:
            raise ConfigError(f"{self.name}.model: expected a model (or an upstream Checkpoint)")
        out = ctx.outputs["corpus"]
        work = str(ctx.work_dir) if ctx.work_dir is not None else None
        report = generate(cfg, out.path, work, ctx.runtime)
        out.counts = {"documents": report["kept"], "rejected": report["rejected"]}
        out.meta = {"removed_by_reason": report["removed_by_reason"], "model": cfg.model}
        return {
            "kept": report["kept"],
            "rejected": report["rejected"],
            "rows_per_s": report["rows_per_s"],
            "tokens_per_s": report["tokens_per_s"],
            "batches_processed": report["batches"]["processed"],
            "batches_resumed": report["batches"]["resumed"],
        }
