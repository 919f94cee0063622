"""`kiln stages [NAME]`: the stages a spec can name, and one stage's fields with their type,
default and description (the same rows as docs/yaml-reference.md), plus the model presets."""

from __future__ import annotations

import inspect

from kiln.platform.errors import KilnError
from kiln.platform.reference import field_rows
from kiln.platform.registry import component, public_stages, stage_class


def _plain(cell: str) -> str:
    """A markdown reference cell as terminal text."""
    return cell.replace("\\|", "|").replace("`", "").replace("**", "")


def _short(default: str, width: int = 24) -> str:
    """A nested model's whole default is its rows below: the column shows the start."""
    return default if len(default) <= width else default[: width - 3] + "..."


def _summary(cls) -> str:
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    return doc.split("\n\n")[0].replace("\n", " ")


def stage_list() -> list[str]:
    """One line per user-facing stage: its name and what it does."""

    lines = []
    for name in public_stages():
        try:
            summary = _summary(stage_class(name))
        except KilnError as e:  # an area whose extra is not installed: say so, list the rest
            summary = f"(unavailable: {e})"
        lines.append(f"  {name:<20} {summary}")
    return ["Stages (`stage:` in a spec):", *lines]


def stage_detail(name: str) -> list[str]:
    """A stage's slots and a FIELD / TYPE / DEFAULT / DESCRIPTION table of its config."""

    cls = stage_class(name)
    ins = ", ".join(f"{s} ({k})" for s, k in cls.input_kinds.items()) or "none"
    outs = ", ".join(f"{s} ({k})" for s, k in cls.output_kinds.items()) or "none"
    rows = [
        (key, typ, _short(_plain(default)), desc)
        for key, typ, default, desc in ((_plain(c) for c in row) for row in field_rows(cls.Config))
    ]
    header = ("FIELD", "TYPE", "DEFAULT", "DESCRIPTION")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    table = [
        "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
        for r in [header, *rows]
    ]
    return [f"{name}: {_summary(cls)}", f"inputs: {ins}", f"outputs: {outs}", "", *table]


def preset_lines() -> list[str]:
    """The model presets `model: NAME` (train, sft) accepts, with their size."""
    # the model is a layer above the platform: the composition root names it (kiln/stages.py)
    PRESETS, ModelConfig = component("model.presets"), component("model.config")

    lines = ["Model presets (`model: NAME` or `model: {preset: NAME, ...}` in train):"]
    for name, fields in PRESETS.items():
        cfg = ModelConfig(**fields)
        params = cfg.num_params() / 1e6
        size = f"{params:,.0f}M" if params >= 1 else f"{params:.2f}M"
        lines.append(
            f"  {name:<12} {size:>7} parameters: {cfg.n_layers} layers, dim {cfg.dim}, "
            f"{cfg.n_heads} heads ({cfg.n_kv_heads} KV), vocab {cfg.vocab_size}, "
            f"context {cfg.max_seq_len}"
        )
    return lines


def print_stages(name: str | None) -> int:
    lines = stage_detail(name) if name else [*stage_list(), "", *preset_lines()]
    if not name:
        lines += ["", "`kiln stages NAME` shows a stage's fields (docs/yaml-reference.md)."]
    print("\n".join(lines))
    return 0
