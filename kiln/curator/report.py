"""report.json (documents in, kept and removed per step) and the funnel plot."""

from __future__ import annotations

import json
from collections import Counter

from kiln.curator.readers import base as read_reasons

MALFORMED = [
    read_reasons.INVALID_JSON,
    read_reasons.NOT_AN_OBJECT,
    read_reasons.INVALID_UTF8,
    read_reasons.MISSING_TEXT,
    read_reasons.NON_STRING_TEXT,
    read_reasons.EMPTY_TEXT,
    read_reasons.TOO_LARGE,
    read_reasons.NO_TEXT_EXTRACTED,
]


def build_report(
    n_in: int,
    reasons: Counter,
    filter_names: list[str],
    dedup_counts: dict,
    kept: int,
    seconds: dict,
    pii: dict | None = None,
) -> dict:
    """Per-step funnel: read -> clean -> [pii] -> each filter -> exact dedup -> fuzzy dedup
    -> [semantic, substring, sentence dedup].
    `pii` (when the step ran): its mode and items/documents per type."""
    steps = funnel_steps(n_in, reasons, filter_names, dedup_counts, pii)
    by_reason = removed_by_reason(reasons, dedup_counts)
    remaining = steps[-1]["kept"]
    return {
        "documents_in": n_in,
        **({"pii": pii} if pii is not None else {}),
        "kept": kept,
        "rejected": n_in - kept,
        "invariant_holds": n_in == kept + sum(by_reason.values()) and remaining == kept,
        "removed_by_reason": {k: v for k, v in by_reason.items() if v},
        "steps": steps,
        "dedup": dedup_counts,
        "seconds": seconds,
    }


def funnel_steps(
    n_in: int,
    reasons: Counter,
    filter_names: list[str],
    dedup_counts: dict,
    pii: dict | None = None,
) -> list[dict]:
    """Each step's documents in, removed and kept, in the order the curator applies them."""
    steps: list[dict] = []

    def step(name: str, removed: int, **extra) -> None:
        remaining = steps[-1]["kept"] if steps else n_in
        steps.append(
            {"step": name, "in": remaining, "removed": removed, "kept": remaining - removed} | extra
        )

    malformed = {r: reasons.get(r, 0) for r in MALFORMED if reasons.get(r, 0)}
    step("read", sum(malformed.values()), reasons=malformed)
    step("clean", reasons.get("empty_after_cleaning", 0))
    if pii is not None:  # removes documents in drop mode only; redactions are counted by type
        step("pii", reasons.get("pii", 0), **pii)
    for name in filter_names:
        step(f"filter:{name}", reasons.get(name, 0))
    step("exact_dedup", dedup_counts.get("exact_duplicates", 0))
    step(
        "fuzzy_dedup",
        dedup_counts.get("fuzzy_duplicates", 0),
        clusters=dedup_counts.get("fuzzy_clusters", 0),
        candidate_pairs=dedup_counts.get("candidate_pairs", 0),
        duplicate_pairs=dedup_counts.get("duplicate_pairs", 0),
    )
    if "semantic_duplicates" in dedup_counts:  # opt-in: absent from other runs' funnels
        step(
            "semantic_dedup",
            dedup_counts["semantic_duplicates"],
            clusters=dedup_counts.get("semantic_clusters", 0),
        )
    for name in ("substring_dedup", "sentence_dedup"):  # opt-in, like semantic dedup
        if f"{name}_removed" in dedup_counts:
            step(
                name,
                dedup_counts[f"{name}_removed"],
                documents_cut=dedup_counts.get(f"{name}_documents_cut", 0),
                chars_cut=dedup_counts.get(f"{name}_chars_cut", 0),
            )
    return steps


def removed_by_reason(reasons: Counter, dedup_counts: dict) -> dict[str, int]:
    """Every reason a document was removed (read, clean, filters, dedup), sorted by name."""
    dedup = Counter(
        {
            "exact_duplicate": dedup_counts.get("exact_duplicates", 0),
            "fuzzy_duplicate": dedup_counts.get("fuzzy_duplicates", 0),
            "semantic_duplicate": dedup_counts.get("semantic_duplicates", 0),
            "substring_dedup": dedup_counts.get("substring_dedup_removed", 0),
            "sentence_dedup": dedup_counts.get("sentence_dedup_removed", 0),
        }
    )
    return dict(sorted((reasons + dedup).items()))


def write_report(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2)


def plot_funnel(report: dict, path: str) -> None:
    """Horizontal bars: documents left after each step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [
        s
        for s in report["steps"]
        if s["removed"] or s["step"] in ("read", "exact_dedup", "fuzzy_dedup")
    ]
    labels = ["input"] + [s["step"] for s in steps]
    values = [report["documents_in"]] + [s["kept"] for s in steps]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(labels) + 1.2))
    ax.barh(range(len(labels)), values, color="#c0504d")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,}", va="center", fontsize=8)
    ax.set_xlabel("documents remaining")
    ax.set_title(f"curation funnel: {report['documents_in']:,} in, {report['kept']:,} kept")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
