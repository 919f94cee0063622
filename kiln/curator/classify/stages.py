"""The `classify` pipeline stage: a Corpus in (or `input` paths), a Corpus out with the score
columns, `rejected/`, `report.json` and the trained `model/`."""

from __future__ import annotations

import hashlib
import os
from typing import ClassVar

from kiln.curator.classify.config import ClassifyConfig
from kiln.curator.classify.data import expand
from kiln.curator.classify.run import classify
from kiln.platform.artifact import parquet_files
from kiln.platform.errors import ConfigError
from kiln.platform.stage import Stage, StageContext


class ClassifyStage(Stage):
    """Train a quality or domain classifier (fastText, or a head over sentence embeddings) or
    score perplexity, over a Corpus; `curate` filters with the trained model. A second Corpus,
    `labelled` (an annotator's `generate` output), gives the training labels."""

    type_name = "classify"
    Config = ClassifyConfig
    input_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus", "labelled": "Corpus"}
    optional_inputs: ClassVar[frozenset[str]] = frozenset({"corpus", "labelled"})
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}

    def extra_fingerprint(self) -> str:
        """Names, sizes and mtimes of the files read: a changed file invalidates the cache."""

        cfg: ClassifyConfig = self.config  # type: ignore[assignment]
        h = hashlib.sha256()
        labelled = [cfg.labelled] if isinstance(cfg.labelled, str) else cfg.labelled or []
        paths = [*cfg.input, *cfg.high_quality, *labelled]
        for path in expand(paths, f"{self.name}.input") if paths else []:
            st = os.stat(path)
            h.update(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:16]

    def run(self, ctx: StageContext) -> dict:
        cfg: ClassifyConfig = self.config  # type: ignore[assignment]
        if "corpus" in ctx.inputs:
            cfg = cfg.model_copy(
                update={"input": [*cfg.input, *parquet_files(ctx.inputs["corpus"].path)]}
            )
        # an unnamed labelled slot would take the latest Corpus, the one being classified
        if "labelled" in self.inputs and "labelled" in ctx.inputs:
            cfg = cfg.model_copy(update={"labelled": parquet_files(ctx.inputs["labelled"].path)})
        if not cfg.input:
            raise ConfigError(f"{self.name}.input: expected files or folders (or a Corpus)")
        if cfg.cluster == "ray":
            ctx.ray()
        out = ctx.outputs["corpus"]
        report = classify(cfg, out.path)
        out.counts = {"documents": report["kept"], "rejected": report["rejected"]}
        out.meta = {
            "removed_by_reason": report["removed_by_reason"],
            "held_out_accuracy": report["model"].get("held_out_accuracy"),
            "labels": report["model"]["labels"],
        }
        return {
            "kept": report["kept"],
            "rejected": report["rejected"],
            "held_out_accuracy": report["model"].get("held_out_accuracy"),
            "score_docs_per_s": report["score_docs_per_s"],
        }
