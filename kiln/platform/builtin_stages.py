"""Small built-in stages that exercise the contract end to end without the heavy areas.

- `text.read`: text files -> a Corpus (Parquet: id, text, source).
- `text.stats`: a Corpus -> document/word/character counts computed by Ray tasks.
- `noop`: one trivial Ray task (the platform-overhead benchmark measures around it).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from kiln.platform.artifact import parquet_files
from kiln.platform.errors import InputError
from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext


def _expand(paths: list[str], pattern: str) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        p = Path(os.path.expanduser(raw))
        if p.is_dir():
            files += sorted(f for f in p.glob(pattern) if f.is_file())
        elif p.is_file():
            files.append(p)
        else:
            matches = sorted(Path(m) for m in glob.glob(str(p), recursive=True))
            if not matches:
                raise InputError(f"text.read.paths: {raw}: no such file or directory")
            files += [m for m in matches if m.is_file()]
    return files


class TextReadConfig(StageConfig):
    paths: list[str] = Field(description="Files, directories or globs to read.")
    pattern: str = Field("**/*.txt", description="Glob used inside directories.")
    encoding: str = Field("utf-8", description="Text encoding; undecodable bytes are replaced.")


class TextRead(Stage):
    """Read text files into a Corpus, one document per file."""

    type_name = "text.read"
    Config = TextReadConfig
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def extra_fingerprint(self) -> str:
        files = _expand(self.config.paths, self.config.pattern)
        stat = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return hashlib.sha256(json.dumps(stat).encode()).hexdigest()

    def run(self, ctx: StageContext) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = _expand(self.config.paths, self.config.pattern)
        if not files:
            raise InputError(
                f"text.read.paths: no files match {self.config.pattern!r} in {self.config.paths}"
            )
        texts = [f.read_bytes().decode(self.config.encoding, errors="replace") for f in files]
        ids = [hashlib.sha1(str(f).encode()).hexdigest()[:16] for f in files]
        table = pa.table({"id": ids, "text": texts, "source": [str(f) for f in files]})
        out = ctx.outputs["corpus"]
        pq.write_table(table, Path(out.path) / "part-00000.parquet", compression="zstd")
        out.counts = {"documents": len(files), "bytes": sum(len(t.encode()) for t in texts)}
        return {"documents": len(files)}


class TextStatsConfig(StageConfig):
    top_words: int = Field(20, ge=0, description="How many of the most frequent words to report.")
    chunk_size: int = Field(256, ge=1, description="Documents per Ray task.")


def _count(texts: list[str]) -> dict[str, Any]:
    from collections import Counter

    words = Counter(w.lower() for t in texts for w in t.split())
    return {
        "documents": len(texts),
        "chars": sum(map(len, texts)),
        "words": sum(words.values()),
        "counter": words,
    }


class TextStats(Stage):
    """Count documents, words and characters of a Corpus with Ray tasks."""

    type_name = "text.stats"
    Config = TextStatsConfig
    input_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}
    output_kinds: ClassVar[dict[str, str]] = {"stats": "Stats"}
    resources: ClassVar[Resources] = Resources(ray=True)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        from collections import Counter

        import pyarrow.parquet as pq
        import ray

        ctx.ray()
        texts = [
            t
            for f in parquet_files(ctx.inputs["corpus"].path)
            for t in pq.read_table(f, columns=["text"])["text"].to_pylist()
        ]
        n = self.config.chunk_size
        count = ray.remote(num_cpus=0.25)(_count)
        parts = ray.get([count.remote(texts[i : i + n]) for i in range(0, len(texts), n)])
        total = Counter()
        for p in parts:
            total.update(p["counter"])
        stats = {
            "documents": sum(p["documents"] for p in parts),
            "words": sum(p["words"] for p in parts),
            "chars": sum(p["chars"] for p in parts),
            "top_words": total.most_common(self.config.top_words),
        }
        out = ctx.outputs["stats"]
        (Path(out.path) / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False))
        out.counts = {k: stats[k] for k in ("documents", "words", "chars")}
        return {k: stats[k] for k in ("documents", "words", "chars")}


class NoopConfig(StageConfig):
    tag: str = Field("", description="Anything; changes the fingerprint.")


class Noop(Stage):
    """Run one trivial Ray task and write an empty artifact."""

    type_name = "noop"
    Config = NoopConfig
    output_kinds: ClassVar[dict[str, str]] = {"out": "Stats"}
    resources: ClassVar[Resources] = Resources(ray=True)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        import ray

        ctx.ray()
        value = ray.get(ray.remote(num_cpus=0.1)(lambda: 1).remote())
        return {"value": value}
