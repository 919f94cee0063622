"""The `curate` pipeline stage: input paths come from the config, the output is a Corpus."""

from __future__ import annotations

import hashlib
import os
from typing import ClassVar

from kiln.curator.config import CurateConfig
from kiln.platform.stage import Stage, StageContext


class CurateStage(Stage):
    type_name = "curate"
    Config = CurateConfig
    input_kinds: ClassVar[dict[str, str]] = {}
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}

    def extra_fingerprint(self) -> str:
        """Input files' names, sizes and mtimes: a changed input invalidates the cache."""
        from kiln.curator.readers import expand_inputs

        h = hashlib.sha256()
        for path in expand_inputs(self.config.input):
            st = os.stat(path)
            h.update(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:16]

    def run(self, ctx: StageContext) -> dict:
        from kiln.curator.pipeline import curate

        out = ctx.outputs["corpus"]
        runtime = ctx.ray() if self.config.stream == "ray" or self.config.cluster == "ray" else None
        report = curate(self.config, out.path, runtime=runtime)
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
