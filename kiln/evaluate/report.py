"""How evaluation results are shown: a console line per task, report.md, run.json's metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _stderr(scores: dict[str, Any]) -> str:
    err = scores.get(f"{scores['metric']}_stderr")
    return f" ± {err:.3f}" if isinstance(err, float) else ""


def console_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for name, s in result["tasks"].items():
        score = "n/a" if s["score"] is None else f"{s['score']:.4f}"
        lines.append(
            f"  {name:<24} {s['metric'] or '-':<12} {score}{_stderr(s)}  ({s['samples']} items)"
        )
    p = result.get("perplexity")
    if p:
        lines.append(
            f"  {'perplexity/' + p['split']:<24} {'perplexity':<12} {p['perplexity']:.4f}"
            f"  ({p['tokens']} tokens)"
        )
    return lines


def flat_metrics(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, s in result["tasks"].items():
        if s["metric"]:
            out[f"{name}/{s['metric']}"] = s["score"]
    p = result.get("perplexity")
    if p:
        out[f"{p['split']}/perplexity"] = p["perplexity"]
        out[f"{p['split']}/tokens"] = p["tokens"]
    if result.get("lm_eval_version"):
        out["lm_eval_version"] = result["lm_eval_version"]
    return out


def write_report(result: dict[str, Any], path: Path) -> None:
    rows = ["| task | type | metric | score | ± | items |", "| --- | --- | --- | --- | --- | --- |"]
    for name, s in result["tasks"].items():
        err = s.get(f"{s['metric']}_stderr")
        score = "" if s["score"] is None else f"{s['score']:.4f}"
        err_text = f"{err:.3f}" if isinstance(err, float) else ""
        rows.append(
            f"| {name} | {s['output_type']} | {s['metric']} | {score} | {err_text} "
            f"| {s['samples']} |"
        )
    text = ["# Evaluation", ""]
    if result["tasks"]:
        text += [
            f"lm-evaluation-harness {result['lm_eval_version']} against {result['endpoint']} "
            f"({result['api']}).",
            "",
            *rows,
            "",
        ]
    p = result.get("perplexity")
    if p:
        text += [
            f"Held-out perplexity on the `{p['split']}` split: **{p['perplexity']:.4f}** "
            f"(mean NLL {p['nll']:.4f} nats over {p['tokens']} tokens, "
            f"{p['windows']} windows of {p['seq_len']}).",
            "",
        ]
    path.write_text("\n".join(text), encoding="utf-8")
