"""The `curate` pipeline stage: input paths come from the config and, optionally, from an earlier
stage's Corpus (its Parquet shards); the output is a Corpus."""

from __future__ import annotations

import hashlib
import os
from typing import ClassVar

from kiln.curator.config import CurateConfig
from kiln.platform.stage import Stage, StageContext


class CurateStage(Stage):
    type_name = "curate"
    Config = CurateConfig
    input_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}
    optional_inputs: ClassVar[frozenset[str]] = frozenset({"corpus"})
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}

    def extra_fingerprint(self) -> str:
        """Input files' names, sizes and mtimes: a changed input invalidates the cache."""
        from kiln.curator.readers import expand_inputs

        h = hashlib.sha256()
        if not self.config.input:  # only an upstream Corpus: its fingerprint covers it
            return ""
        for path in expand_inputs(self.config.input):
            st = os.stat(path)
            h.update(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:16]

    def run(self, ctx: StageContext) -> dict:
        from kiln.curator.pipeline import curate
        from kiln.platform.artifact import parquet_files
        from kiln.platform.errors import ConfigError

        cfg: CurateConfig = self.config  # type: ignore[assignment]
        out = ctx.outputs["corpus"]
        if "corpus" in ctx.inputs:  # an upstream Corpus joins the configured paths
            cfg = cfg.model_copy(
                update={"input": [*cfg.input, *parquet_files(ctx.inputs["corpus"].path)]}
            )
        if not cfg.input:
            raise ConfigError(
                f"{self.name}.input: expected files, folders or globs (or an upstream Corpus)"
            )
        runtime = ctx.ray() if cfg.stream == "ray" or cfg.cluster == "ray" else None
        report = curate(cfg, out.path, runtime=runtime)
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
        }
