"""The run report's training panels: a grid of scalar charts from a stage's `metrics.jsonl`.

One chart per quantity the trainer logs every step (loss with the held-out loss beside it,
learning rate, grad norm, tokens/s, MFU, memory; DPO's reward accuracy and margin), each on an
integer step axis, raw and smoothed. Any training-like stage (train, sft, dpo, and later ones)
that writes `metrics.jsonl` gets the same grid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln.platform.report_charts import empty_panel, line_chart

MAX_METRIC_ROWS = 200_000
PANEL = {"width": 470, "height": 240}

# (panel title, y label, [(metrics.jsonl key, legend name)], scale, note when no data)
PANELS: list[tuple[str, str, list[tuple[str, str]], float, str | None]] = [
    ("loss", "loss", [("loss", "train"), ("val_loss", "validation")], 1.0, None),
    ("learning rate", "lr", [("lr", "lr")], 1.0, None),
    ("grad norm", "norm", [("grad_norm", "grad norm")], 1.0, None),
    ("tokens/s", "tokens/s", [("tokens_per_s", "tokens/s")], 1.0, None),
    (
        "MFU",
        "%",
        [("mfu", "MFU")],
        100.0,
        "not measured: no known device peak (set peak_tflops)",
    ),
    ("peak memory", "GB", [("peak_mem_gb", "peak memory")], 1.0, None),
    (
        "reward accuracy",
        "share",
        [("rewards/accuracies", "train"), ("val_rewards/accuracies", "validation")],
        1.0,
        None,
    ),
    (
        "reward margin",
        "margin",
        [("rewards/margins", "train"), ("val_rewards/margins", "validation")],
        1.0,
        None,
    ),
]


def read_steps(path: Path) -> list[dict[str, Any]]:
    """One row per step, in step order; a re-run step (after a restart) replaces the first."""
    by_step: dict[int, dict] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= MAX_METRIC_ROWS:
                break
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "step" in row:
                by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def _points(rows: list[dict], key: str, scale: float) -> tuple[list[float], list[float]]:
    pts = [
        (r["step"], float(r[key]) * scale)
        for r in rows
        if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def scalar_grid(rows: list[dict[str, Any]], stage: str) -> str:
    """The grid of charts; a panel whose quantity was never logged is left out, or (MFU) says
    why it is empty."""
    cells = []
    for title, y_label, keys, scale, note in PANELS:
        series = {name: _points(rows, key, scale) for key, name in keys}
        series = {name: xy for name, xy in series.items() if xy[0]}
        label = f"{stage}: {title}"
        if series:
            cells.append(line_chart(series, label, "step", y_label, metric=title, **PANEL))
        elif note:
            cells.append(empty_panel(label, note, **PANEL))
    return '<div class="grid">' + "\n".join(cells) + "</div>" if cells else ""


def training_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The last step's scalars, and the last held-out values (logged only at eval steps)."""
    last = {k: v for k, v in rows[-1].items() if k != "time"}
    for row in reversed(rows):
        for k, v in row.items():
            if k.startswith("val_") and k not in last:
                last[k] = v
    return {"steps logged": len(rows), **last}
