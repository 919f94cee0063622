"""Text every machine has without a download: the Python documentation that ships with the
interpreter (`pydoc_data`) and a small Japanese sample that ships with kiln."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext

JA_SAMPLE = Path(__file__).parent / "data" / "ja_sample.jsonl"


def python_docs_documents(chunk_chars: int = 4000) -> list[dict[str, str]]:
    """One document per pydoc topic, long topics cut at paragraph breaks near `chunk_chars`."""
    from pydoc_data.topics import topics

    docs = []
    for name in sorted(topics):
        paragraphs, buf, part = topics[name].split("\n\n"), [], 0
        for para in paragraphs:
            buf.append(para)
            if sum(map(len, buf)) >= chunk_chars:
                docs.append(
                    {"id": f"pydoc:{name}:{part}", "text": "\n\n".join(buf), "source": "pydoc_data"}
                )
                buf, part = [], part + 1
        if buf:
            docs.append(
                {"id": f"pydoc:{name}:{part}", "text": "\n\n".join(buf), "source": "pydoc_data"}
            )
    return docs


def japanese_documents() -> list[dict[str, str]]:
    return [
        json.loads(line)
        for line in JA_SAMPLE.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


class PythonDocsConfig(StageConfig):
    chunk_chars: int = Field(
        4000, ge=200, description="Cut long pydoc topics into documents of about this size."
    )
    japanese: bool = Field(True, description="Add kiln's small Japanese sample.")
    repeat_japanese: int = Field(
        1, ge=1, description="Repeat the Japanese sample (ids stay unique)."
    )


class PythonDocsSample(Stage):
    """Write the shipped sample text as a Corpus (Parquet: id, text, source) and as raw JSONL."""

    type_name = "sample.python_docs"
    Config = PythonDocsConfig
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        docs = python_docs_documents(self.config.chunk_chars)
        if self.config.japanese:
            ja = japanese_documents()
            for r in range(self.config.repeat_japanese):
                docs += [{**d, "id": d["id"] if r == 0 else f"{d['id']}-r{r}"} for d in ja]
        out = Path(ctx.outputs["corpus"].path)
        table = pa.Table.from_pylist(
            docs,
            schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string())]),
        )
        pq.write_table(table, out / "part-00000.parquet", compression="zstd")
        with open(out / "raw.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
        ctx.outputs["corpus"].counts = {
            "documents": len(docs),
            "chars": sum(len(d["text"]) for d in docs),
        }
        return {"documents": len(docs)}
