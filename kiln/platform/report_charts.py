"""Inline SVG charts for the run report: line charts (training scalars) and a horizontal funnel.

Plain SVG text, no plotting library and nothing fetched, so the page stays self-contained and
renders the same in any browser."""

from __future__ import annotations

import json
import math
from html import escape

PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-2:
        return f"{v:.3g}"
    return f"{v:.4g}"


def _ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About n round tick values covering [lo, hi]; whole numbers only when `integer` (a step
    axis: a 2-step curve gets ticks 1 and 2, not 1.0, 1.2, ...)."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    if integer:
        step = max(1, round(step))
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _labels(ticks: list[float]) -> list[str]:
    """Tick labels, with as many digits as it takes to tell neighbours apart."""
    labels = [_fmt(t) for t in ticks]
    for digits in range(4, 10):
        if len(set(labels)) == len(labels):
            break
        labels = [f"{t:.{digits}g}" for t in ticks]
    return labels


def smooth(ys: list[float], weight: float = 0.6) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start."""
    out, avg = [], 0.0
    for i, y in enumerate(ys, 1):
        avg = weight * avg + (1 - weight) * y
        out.append(avg / (1 - weight**i))
    return out


def _series_data(series: dict[str, tuple[list[float], list[float]]]) -> str:
    """The plotted points as JSON in an attribute: the page's data, readable by a test or a
    person who saves the page."""
    data = {
        name: [[x, round(y, 6)] for x, y in zip(xs, ys, strict=True)]
        for name, (xs, ys) in series.items()
    }
    return escape(json.dumps(data, separators=(",", ":")), quote=True)


def line_chart(
    series: dict[str, tuple[list[float], list[float]]],
    title: str,
    x_label: str = "step",
    y_label: str = "",
    width: int = 640,
    height: int = 300,
    integer_x: bool = True,
    metric: str = "",
) -> str:
    """An SVG line chart of one or more (x, y) series sharing both axes. Each series is drawn
    raw and smoothed (the page's "smooth curves" switch shows one or the other); sparse series
    get a marker at each point."""
    series = {
        name: tuple(map(list, zip(*pts, strict=True)))
        for name, (xs, ys) in series.items()
        if (
            pts := [
                (x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)
            ]
        )
    }
    pts = [(x, y) for xs, ys in series.values() for x, y in zip(xs, ys, strict=True)]
    if not pts:
        return ""
    left, right, top, bottom = 64, 16, 32, 44
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x0, x1 = (x0 - 1, x1 + 1) if integer_x else (x0 - 0.5, x1 + 0.5)
    if y1 == y0:
        y0, y1 = (y0 - 0.5, y1 + 0.5) if y0 == 0 else (y0 - abs(y0) * 0.1, y1 + abs(y1) * 0.1)
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" '
        f'data-metric="{escape(metric or title)}" data-series="{_series_data(series)}">',
        f'<text x="{left}" y="20" class="title">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot"/>',
    ]
    y_ticks = _ticks(y0, y1)
    for t, label in zip(y_ticks, _labels(y_ticks), strict=True):
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" class="tick" text-anchor="end">'
            f"{label}</text>"
        )
    for t in _ticks(max(x0, math.ceil(x0)) if integer_x else x0, x1, integer=integer_x):
        label = f"{int(t)}" if integer_x else _fmt(t)
        out.append(
            f'<text x="{sx(t):.1f}" y="{top + ph + 16}" class="tick xtick" '
            f'text-anchor="middle">{label}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 6}" class="axis" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    out.append(
        f'<text x="14" y="{top + ph / 2}" class="axis" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + ph / 2})">{escape(y_label)}</text>'
    )
    for i, (name, (xs, ys)) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        for kind, values in (("raw", ys), ("smooth", smooth(ys))):
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, values, strict=True))
            out.append(
                f'<polyline class="{kind}" points="{coords}" fill="none" stroke="{color}" '
                'stroke-width="1.8"/>'
            )
        if len(xs) <= 40:
            out += [
                f'<circle class="raw" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>'
                for x, y in zip(xs, ys, strict=True)
            ]
        ly = top + 14 + 16 * i
        out.append(
            f'<line x1="{left + pw - 130}" x2="{left + pw - 112}" y1="{ly - 4}" '
            f'y2="{ly - 4}" stroke="{color}" stroke-width="3"/>'
        )
        out.append(f'<text x="{left + pw - 106}" y="{ly}" class="tick">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def empty_panel(title: str, note: str, width: int = 640, height: int = 300) -> str:
    """A grid cell saying why a chart has no data (MFU without a known device peak)."""
    return (
        f'<svg class="chart empty" role="img" aria-label="{escape(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" '
        f'data-metric="{escape(title)}" data-series="{{}}">'
        f'<text x="64" y="20" class="title">{escape(title)}</text>'
        f'<rect x="64" y="32" width="{width - 80}" height="{height - 76}" class="plot"/>'
        f'<text x="{(width + 48) / 2}" y="{height / 2}" class="tick" text-anchor="middle">'
        f"{escape(note)}</text></svg>"
    )


def funnel_chart(steps: list[tuple[str, int, int]], title: str, width: int = 640) -> str:
    """Horizontal bars: the documents left after each step (name, kept, removed)."""
    if not steps:
        return ""
    top, row, label_w = 30, 22, 200
    height = top + row * len(steps) + 10
    start = max(max(k + r for _, k, r in steps), 1)
    bar_w = width - label_w - 90
    out = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="4" y="18" class="title">{escape(title)}</text>',
    ]
    for i, (name, kept, removed) in enumerate(steps):
        y = top + i * row
        w = bar_w * kept / start
        out.append(
            f'<text x="{label_w - 6}" y="{y + 14}" class="tick" text-anchor="end">'
            f"{escape(name)}</text>"
        )
        out.append(
            f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 6}" class="bar"/>'
        )
        note = f"{kept:,}" + (f"  (-{removed:,})" if removed else "")
        out.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 14}" class="tick">{note}</text>')
    out.append("</svg>")
    return "\n".join(out)
