"""`report.html`: one self-contained page per run, written at the end of every `kiln run`.

It reads what the run left behind — `run.json` and, in each stage's folder (or the folder a cached
stage came from), the files stages write: a curation `report.json` (funnel), `metrics.jsonl`
(loss curves), `tokens.json` (dataset summary), `completions.json`, `stats.json`, PNG plots and
`error.txt` — and renders them with inline CSS, inline SVG charts and base64 PNGs. Nothing is
fetched, so the page opens from a laptop, a bucket or an e-mail attachment.
"""

from __future__ import annotations

import base64
import json
import os
from html import escape
from pathlib import Path
from typing import Any

from kiln.platform.report_curation import curation_section
from kiln.platform.report_run import artifact_links, eval_scores, run_info
from kiln.platform.report_training import read_steps, scalar_grid, training_summary

REPORT_FILE = "report.html"
SKIP_DIRS = {"ray", "tensorboard", "rejected", "checkpoints", "_work", ".work", "triton"}
MAX_PNG_BYTES = 3 << 20

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;
max-width:1000px;color:#111;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:16px 0 6px}.meta{color:#555}
table{border-collapse:collapse;margin:6px 0 12px}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f5f5f5}td.num{text-align:right;white-space:nowrap}
.status{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;color:#fff}
.succeeded,.done{background:#16a34a}.cached{background:#0891b2}.failed{background:#dc2626}
.running,.pending{background:#a3a3a3}.interrupted{background:#d97706}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:360px;white-space:pre-wrap}
img{max-width:100%;border:1px solid #eee}figure{margin:8px 0}figcaption{color:#555}
svg .title{font-weight:600;font-size:13px}svg .tick{font-size:11px;fill:#333}
svg .axis{font-size:12px;fill:#333}svg .grid{stroke:#e5e5e5}svg .plot{fill:#fff;stroke:#ccc}
svg .bar{fill:#2563eb}footer{margin-top:32px;color:#777;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(470px,1fr));gap:8px}
svg .smooth{display:none}body.smoothing svg .smooth{display:inline}
body.smoothing svg .raw{opacity:.25}td.doc{font-size:12px;overflow-wrap:anywhere}
table.info th{width:110px}details pre{max-height:480px}.toggle{float:right;font-size:13px}
"""
# Reports, in the page itself, whether every <img> decoded (the test reads it from the DOM).
CHECK_IMAGES = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var bad = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  var el = document.getElementById('image-check');
  el.textContent = (imgs.length - bad.length) + ' of ' + imgs.length + ' images loaded';
  el.setAttribute('data-broken', String(bad.length));
});
"""
# The "smooth curves" switch: every chart carries its raw and smoothed lines; CSS shows one.
SMOOTHING = """
document.getElementById('smoothing').addEventListener('change', function (e) {
  document.body.classList.toggle('smoothing', e.target.checked);
});
"""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _fmt(v: Any) -> str:
    if isinstance(v, dict):  # e.g. the curator's seconds per phase
        return ", ".join(f"{escape(str(k))} {_fmt(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return escape(str(v))


def _table(rows: list[list[Any]], head: list[str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>")
    for r in rows:
        cells = "".join(
            f'<td class="num">{_fmt(c)}</td>'
            if isinstance(c, int | float)
            else f"<td>{_fmt(c)}</td>"
            for c in r
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _scalars(d: dict, limit: int = 12) -> list[list[Any]]:
    return [[k, v] for k, v in d.items() if isinstance(v, int | float | str | bool)][:limit]


def _files(root: Path, max_files: int = 400) -> list[Path]:
    """The files under a stage folder, skipping bulky machine-only folders."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        if len(Path(dirpath).relative_to(root).parts) > 3:
            dirnames[:] = []
        out += [Path(dirpath) / f for f in sorted(filenames)]
        if len(out) >= max_files:
            break
    return out


def _training(path: Path, stage: str) -> str:
    """The scalar grid of a metrics.jsonl and the last step's figures."""
    rows = read_steps(path)
    if not rows:
        return ""
    return (
        "<h3>Training</h3>"
        + scalar_grid(rows, stage)
        + _table(_scalars(training_summary(rows), 16))
    )


def _tokens(meta: dict) -> str:
    rows = [[k, meta[k]] for k in ("vocab_size", "dtype", "eod_token", "seed") if k in meta]
    splits = meta.get("splits") or {}
    split_rows = [[name, c.get("documents", ""), c.get("tokens", "")] for name, c in splits.items()]
    return "<h3>Dataset</h3>" + _table(rows) + _table(split_rows, ["split", "documents", "tokens"])


# Files of records shown as a table (the model's answers at the end of a run), by file name.
RECORD_FILES = {"completions.json": "Completions", "answers.json": "Answers: base vs tuned"}


def _records(items: list, title: str, limit: int = 100) -> str:
    """A JSON list of flat objects as a table whose columns are their keys, in first-seen order."""
    items = [it for it in items if isinstance(it, dict)][:limit]
    keys = list(dict.fromkeys(k for it in items for k in it))
    rows = [[str(it.get(k, "")) for k in keys] for it in items]
    return f"<h3>{escape(title)}</h3>" + _table(rows, keys)


def _png(path: Path, root: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    caption = escape(str(path.relative_to(root)))
    return (
        f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def stage_section(name: str, entry: dict, run_dir: Path) -> str:
    """Everything the stage's folder holds that a person would look at."""
    root = Path(entry.get("cached_from") or run_dir / name)
    parts: list[str] = []
    if entry.get("error"):
        parts.append(f"<p><b>error:</b> {escape(str(entry['error']))}</p>")
    if not root.is_dir():
        return "\n".join(parts)
    files = _files(root)
    present = set(files)
    for path in files:
        kind = path.name
        if kind == "report.json" and isinstance(rep := _read_json(path), dict):
            funnel = path.with_name("funnel.png") not in present  # else the stage's own plot
            parts.append(curation_section(rep, path.parent, funnel, _table))
        elif kind == "metrics.jsonl":
            parts.append(_training(path, name))
        elif kind == "metrics.json" and isinstance(res := _read_json(path), dict):
            parts.append(eval_scores(res))
        elif kind == "loss.png" and path.with_name("metrics.jsonl") in present:
            continue  # the grid above draws the same numbers
        elif kind == "tokens.json" and isinstance(meta := _read_json(path), dict):
            parts.append(_tokens(meta))
        elif kind in RECORD_FILES and isinstance(items := _read_json(path), list):
            parts.append(_records(items, RECORD_FILES[kind]))
        elif kind == "stats.json" and isinstance(stats := _read_json(path), dict):
            parts.append(_table(_scalars(stats)))
        elif path.suffix == ".png" and path.stat().st_size <= MAX_PNG_BYTES:
            parts.append(_png(path, root))
        elif kind == "error.txt":
            tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
            parts.append("<pre>" + escape("\n".join(tail)) + "</pre>")
    return "\n".join(p for p in parts if p)


def _count(k: str, v: Any) -> str:
    """One output count; a dict of counts (rejections by reason) as `k: a 3, b 2`."""
    if isinstance(v, dict):
        return f"{k}: " + ", ".join(f"{a} {_fmt(b)}" for a, b in v.items()) if v else ""
    return f"{k} {_fmt(v)}"


def _stage_table(stages: dict, run_dir: Path) -> str:
    rows = []
    for name, e in stages.items():
        metrics = e.get("metrics") or {}
        key = ", ".join(f"{k}={_fmt(v)}" for k, v in _scalars(metrics, 5))
        outs = "; ".join(
            f"{slot}: " + ", ".join(c for k, v in o["counts"].items() if (c := _count(k, v)))
            for slot, o in (e.get("outputs") or {}).items()
            if o.get("counts")
        )
        status = escape(str(e.get("status", "")))
        resumed = metrics.get("resumed_from_step")
        note = f" resumed from step {resumed}" if resumed is not None else ""
        rows.append(
            f"<tr><td>{escape(name)}</td><td>{escape(str(e.get('type', '')))}</td>"
            f'<td><span class="status {status}">{status}</span>{note}</td>'
            f'<td class="num">{_fmt(float(e.get("duration_s", 0.0)))} s</td>'
            f"<td>{key}</td><td>{escape(outs)}</td><td>{artifact_links(e, run_dir)}</td></tr>"
        )
    names = ("stage", "type", "status", "time", "key figures", "outputs", "artifacts")
    head = "".join(f"<th>{h}</th>" for h in names)
    return f"<table><tr>{head}</tr>" + "\n".join(rows) + "</table>"


def render(run_dir: str | os.PathLike) -> str:
    """The report page of one run folder, as HTML text."""
    run_dir = Path(run_dir)
    record = _read_json(run_dir / "run.json") or {}
    stages = record.get("stages", {})
    status = escape(str(record.get("status", "unknown")))
    total = sum(float(e.get("duration_s", 0.0)) for e in stages.values())
    title = f"{record.get('pipeline', run_dir.parent.name)} / {record.get('run_id', run_dir.name)}"
    body = [
        f'<h1>{escape(title)} <span class="status {status}">{status}</span></h1>',
        f'<p class="meta">started {escape(str(record.get("started", "?")))} · ended '
        f"{escape(str(record.get('ended', '—')))} · stages {_fmt(total)} s · {escape(str(run_dir))}"
        "</p>",
    ]
    if record.get("error"):
        body.append(f"<p><b>error:</b> {escape(str(record['error']))}</p>")
    if record.get("status") == "interrupted":
        by = escape(str(record.get("interrupted_by", "a signal")))
        body.append(f"<p><b>interrupted</b> by {by}: the same command resumes the run</p>")
    body += [
        '<label class="toggle"><input type="checkbox" id="smoothing"> smooth curves</label>',
        "<h2>Stages</h2>",
        _stage_table(stages, run_dir),
        run_info(record),
    ]
    for name, entry in stages.items():
        section = stage_section(name, entry, run_dir)
        if section:
            body += [
                f"<h2>{escape(name)} <small>({escape(str(entry.get('type', '')))})</small></h2>",
                section,
            ]
    body.append(
        '<footer>kiln run report · <span id="image-check">images not checked</span></footer>'
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + f"\n<script>{CHECK_IMAGES}{SMOOTHING}</script>\n</body></html>\n"
    )


def write_report(run_dir: str | os.PathLike) -> Path:
    """Render `<run_dir>/report.html` (replaced atomically) and return its path."""
    run_dir = Path(run_dir)
    path = run_dir / REPORT_FILE
    tmp = run_dir / (REPORT_FILE + ".tmp")
    tmp.write_text(render(run_dir), encoding="utf-8")
    os.replace(tmp, path)
    return path
