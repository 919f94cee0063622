"""The run report's curation section: the funnel, the counts, and a sample of the documents
kept and of those rejected for each reason (read from the corpus's Parquet shards)."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from kiln.platform.report_charts import funnel_chart

SAMPLES_KEPT = 3
SAMPLES_PER_REASON = 2
EXCERPT_CHARS = 280


def _excerpt(text: Any) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def sample_documents(folder: Path, per_reason: int, by_reason: bool) -> dict[str, list[dict]]:
    """Up to `per_reason` documents of each reason (or all under "kept") from the folder's
    Parquet shards, in file order; {} when there are none or pyarrow cannot read them."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return {}
    out: dict[str, list[dict]] = {}
    columns = ["id", "text", "reason"] if by_reason else ["id", "text"]
    for path in sorted(folder.glob("*.parquet")):
        try:
            shard = pq.ParquetFile(path)
            if not set(columns) <= set(shard.schema_arrow.names):
                continue
            for batch in shard.iter_batches(batch_size=512, columns=columns):
                for row in batch.to_pylist():
                    group = out.setdefault(str(row["reason"]) if by_reason else "kept", [])
                    if len(group) < per_reason:
                        group.append(row)
                if not by_reason and len(out.get("kept", [])) >= per_reason:
                    return out
        except (OSError, ValueError):
            continue
    return out


def _samples_table(samples: dict[str, list[dict]], title: str) -> str:
    rows = [
        f"<tr><td>{escape(reason)}</td><td>{escape(str(doc['id']))}</td>"
        f'<td class="doc">{escape(_excerpt(doc["text"]))}</td></tr>'
        for reason, docs in sorted(samples.items())
        for doc in docs
    ]
    if not rows:
        return ""
    head = "<tr><th>reason</th><th>id</th><th>text</th></tr>"
    return f"<h3>{escape(title)}</h3><table class='samples'>{head}{''.join(rows)}</table>"


def curation_section(report: dict, corpus_dir: Path, chart: bool, table) -> str:
    """Funnel (unless the stage drew funnel.png), counts, rejection reasons and sample
    documents; `table(rows, head)` renders a plain table."""
    if "steps" not in report:
        return table([[k, v] for k, v in report.items() if isinstance(v, int | float | str)])
    steps = [(s["step"], int(s["kept"]), int(s["removed"])) for s in report["steps"]]
    start = ("input", int(report.get("documents_in", 0)), 0)
    parts = ["<h3>Curation</h3>", funnel_chart([start, *steps], "Curation funnel") if chart else ""]
    keys = ("documents_in", "kept", "rejected", "docs_per_s", "seconds", "invariant_holds")
    parts.append(table([[k, report[k]] for k in keys if k in report]))
    reasons = sorted(report.get("removed_by_reason", {}).items(), key=lambda kv: -kv[1])
    if reasons:
        parts.append(table([[r, n] for r, n in reasons], ["rejection reason", "documents"]))
    pii = report.get("pii")
    if isinstance(pii, dict) and isinstance(pii.get("items"), dict):
        rows = [[k, n, pii.get("documents", {}).get(k, 0)] for k, n in sorted(pii["items"].items())]
        head = [f"PII type ({pii.get('mode', '')})", "items", "documents"]
        parts.append(table(rows or [["none found", 0, 0]], head))
    kept = sample_documents(corpus_dir, SAMPLES_KEPT, by_reason=False)
    parts.append(_samples_table(kept, "Sample of kept documents"))
    rejected = sample_documents(corpus_dir / "rejected", SAMPLES_PER_REASON, by_reason=True)
    parts.append(_samples_table(rejected, "Sample of rejected documents, by reason"))
    return "\n".join(p for p in parts if p)
