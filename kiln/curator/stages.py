"""The `curate` pipeline stage: input paths come from the config and, optionally, from an earlier
stage's Corpus (its Parquet shards); the output is a Corpus."""

from __future__ import annotations

import hashlib
import os
from typing import ClassVar

from kiln.curator.classify.stages import ClassifyStage
from kiln.curator.config import CurateConfig
from kiln.curator.generate.stages import GenerateStage
from kiln.curator.pipeline import Curation, step_needs
from kiln.curator.readers import expand_inputs
from kiln.platform.artifact import parquet_files
from kiln.platform.errors import ConfigError
from kiln.platform.stage import Stage, StageContext, Step, run_steps

# the area's stages, those of its sub-packages too (kiln/stages.py names them here)
__all__ = ["ClassifyStage", "CurateStage", "GenerateStage"]


class CurateStage(Stage):
    """Clean, filter, deduplicate and decontaminate a Corpus (kept and rejected, by reason)."""

    type_name = "curate"
    Config = CurateConfig
    input_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}
    optional_inputs: ClassVar[frozenset[str]] = frozenset({"corpus"})
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}

    def extra_fingerprint(self) -> str:
        """Input files' names, sizes and mtimes: a changed input invalidates the cache."""

        h = hashlib.sha256()
        if not self.config.input:  # only an upstream Corpus: its fingerprint covers it
            return ""
        for path in expand_inputs(self.config.input):
            st = os.stat(path)
            h.update(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:16]

    def run(self, ctx: StageContext) -> dict:
        """Both steps, each with its resources (what the platform does through `steps`)."""
        return run_steps(self, ctx)

    def steps(self) -> list[Step]:
        """Stream (Ray actors when `stream: ray`), then dedup + output (Ray only for Dask-on-Ray):
        the platform shuts an embedded Ray down between them when dedup runs on Dask threads."""

        stream_needs, dedup_needs = step_needs(self.config)
        return [
            Step("stream", stream_needs, self._stream),
            Step("dedup", dedup_needs, self._finish),
        ]

    def _stream(self, ctx: StageContext) -> None:
        cfg: CurateConfig = self.config  # type: ignore[assignment]
        if "corpus" in ctx.inputs:  # an upstream Corpus joins the configured paths
            cfg = cfg.model_copy(
                update={"input": [*cfg.input, *parquet_files(ctx.inputs["corpus"].path)]}
            )
        if not cfg.input:
            raise ConfigError(
                f"{self.name}.input: expected files, folders or globs (or an upstream Corpus)"
            )
        work = str(ctx.work_dir) if ctx.work_dir is not None else None  # a killed run resumes
        self._curation = Curation.prepare(cfg, ctx.outputs["corpus"].path, work_dir=work)
        self._curation.stream(ctx.runtime)

    def _finish(self, ctx: StageContext) -> dict:
        report = self._curation.finish()
        self._curation = None
        out = ctx.outputs["corpus"]
        out.counts = {
            "documents": report["kept"],
            "rejected": report["rejected"],
            "input": report["documents_in"],
        }
        out.meta = {"removed_by_reason": report["removed_by_reason"], "backend": report["backend"]}
        return {
            "docs_per_s": report["docs_per_s"],
            "kept": report["kept"],
            "rejected": report["rejected"],
            "seconds": report["seconds"]["total"],
            "tasks_processed": report["tasks"]["processed"],
            "tasks_resumed": report["tasks"]["resumed"],
        }
