"""The run report's "what ran" section (versions, git sha, host, the `--set` overrides and the
resolved spec from run.json), artifact links and the evaluate stage's scores."""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any


def _cell(value: Any) -> str:
    return "—" if value is None or value == "" else escape(str(value))


def run_info(record: dict) -> str:
    """What ran, from run.json (a run recorded before these fields existed shows none)."""
    versions = record.get("versions") or {}
    host = record.get("host") or {}
    spec = record.get("spec") or {}
    if not (versions or host or spec):
        return ""
    sha = record.get("git_sha")
    if sha and record.get("git_dirty"):
        sha = f"{sha} (with uncommitted changes)"
    rows = [
        ("kiln", versions.get("kiln")),
        ("git sha", sha),
        *((name, versions.get(name)) for name in ("torch", "ray", "transformers", "python")),
        ("host", f"{host.get('hostname', '?')} · {host.get('platform', '?')}" if host else None),
        ("spec", spec.get("source") or "built in Python"),
        ("overrides", " ".join(record.get("overrides") or []) or None),
    ]
    table = "".join(f"<tr><th>{escape(k)}</th><td>{_cell(v)}</td></tr>" for k, v in rows)
    parts = ["<h2>What ran</h2>", f'<table class="info">{table}</table>']
    if spec.get("stages"):
        import yaml

        text = yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=96)
        parts.append(
            "<details><summary>resolved spec (every stage's config, defaults and overrides "
            f"applied)</summary><pre>{escape(text)}</pre></details>"
        )
    return "\n".join(parts)


def artifact_links(entry: dict, run_dir: Path) -> str:
    """Links to a stage's output folders: relative inside the run folder (the page moves with
    it), a file: URL for a cached stage's outputs in an earlier run."""
    links, run_dir = [], run_dir.resolve()
    for slot, out in (entry.get("outputs") or {}).items():
        uri = str(out.get("uri", ""))
        if not uri or "://" in uri:
            links.append(escape(uri or slot))
            continue
        path = Path(uri)
        try:
            href = os.path.relpath(path, run_dir) if path.is_relative_to(run_dir) else None
        except ValueError:
            href = None
        href = (href + "/") if href else path.as_uri() + "/"
        links.append(f'<a href="{escape(href, quote=True)}">{escape(slot)}</a>')
    return " ".join(links)


def eval_scores(result: dict) -> str:
    """The evaluate stage's metrics.json: one row per task, and held-out perplexity."""
    rows = []
    for name, s in (result.get("tasks") or {}).items():
        metric = s.get("metric") or "—"
        err = s.get(f"{metric}_stderr")
        score = s.get("score")
        rows.append(
            f"<tr><td>{escape(name)}</td><td>{_cell(s.get('output_type'))}</td>"
            f"<td>{escape(metric)}</td>"
            f'<td class="num">{"n/a" if score is None else f"{score:.4f}"}</td>'
            f'<td class="num">{f"± {err:.3f}" if isinstance(err, float) else ""}</td>'
            f'<td class="num">{_cell(s.get("samples"))}</td></tr>'
        )
    p = result.get("perplexity")
    if p:
        rows.append(
            f"<tr><td>perplexity/{escape(str(p.get('split')))}</td><td>held-out tokens</td>"
            f'<td>perplexity</td><td class="num">{p["perplexity"]:.4f}</td><td></td>'
            f'<td class="num">{_cell(p.get("tokens"))} tokens</td></tr>'
        )
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("task", "type", "metric", "score", "±", "items"))
    where = result.get("endpoint")
    note = f'<p class="meta">against {escape(str(where))}</p>' if where else ""
    return f"<h3>Evaluation scores</h3>{note}<table><tr>{head}</tr>{''.join(rows)}</table>"
