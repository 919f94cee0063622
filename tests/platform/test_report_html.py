"""report.html: written by every `Pipeline.run` (also a failed one) from what the stages left —
the curator's report.json, Parquet shards and funnel.png, each training stage's metrics.jsonl
(a grid of scalar charts: loss with validation, lr, grad norm, tokens/s, MFU, memory; DPO's
reward accuracy), the evaluate stage's metrics.json, tokens.json, completions.json — plus what
ran (run.json's versions, git sha, overrides and resolved spec) and links to the artifacts.
Rendered by headless Chromium with every image loaded, every chart's data in the DOM and no
request leaving the page; skips when Debian's `chromium` is absent."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.curator.report import build_report, plot_funnel
from kiln.platform.errors import StageFailed
from kiln.platform.report_html import render
from kiln.platform.spec import load_pipeline
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.metrics_log import plot_loss_curve, read_metrics

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
GRID = ["loss", "learning rate", "grad norm", "tokens/s", "MFU", "peak memory"]


class FakeConfig(StageConfig):
    fail: bool = False
    steps: int = 40
    dpo: bool = False


class CurateLike(Stage):
    """Writes what the curate stage writes: report.json (the curator's own builder), funnel.png,
    kept shards and rejected shards with a `reason` column."""

    type_name = "test.curate_like"
    Config = FakeConfig
    output_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}

    def run(self, ctx: StageContext):
        reasons = Counter({"word_count": 7, "language": 3, "invalid_json": 1})
        dedup = {"exact_duplicates": 4, "fuzzy_duplicates": 5}
        report = build_report(120, reasons, ["word_count", "language"], dedup, 100, {"total": 1.5})
        out = Path(ctx.outputs["corpus"].path)
        (out / "report.json").write_text(json.dumps(report))
        plot_funnel(report, str(out / "funnel.png"))
        kept = {"id": [f"k{i}" for i in range(5)], "text": [f"kept text {i}" for i in range(5)]}
        pq.write_table(pa.table(kept), out / "shard-00000.parquet")
        (out / "rejected").mkdir()
        rejected = {
            "id": ["r0", "r1", "r2", "r3"],
            "text": ["too short", "also short", "auf Deutsch", "x" * 2000],
            "reason": ["word_count", "word_count", "language", "language"],
        }
        pq.write_table(pa.table(rejected), out / "rejected" / "part-0.parquet")
        third = {"id": ["r4"], "text": ["a third short one"], "reason": ["word_count"]}
        pq.write_table(pa.table(third), out / "rejected" / "part-1.parquet")
        ctx.outputs["corpus"].counts = {"documents": 100, "rejected": 20, "by_reason": {}}
        return {"documents": 100, "docs_per_s": 80.0}


class TrainLike(Stage):
    """metrics.jsonl (one line a step, validation every 10th) as the trainer writes it; a `dpo`
    one also logs reward accuracy; tokens.json beside its checkpoint."""

    type_name = "test.train_like"
    Config = FakeConfig
    input_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus"}
    output_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint"}

    def run(self, ctx: StageContext):
        tokens = {
            "vocab_size": 2048,
            "dtype": "uint16",
            "splits": {"train": {"documents": 98, "tokens": 51234}},
        }
        (Path(ctx.outputs["checkpoint"].path) / "tokens.json").write_text(json.dumps(tokens))
        with open(ctx.stage_dir / "metrics.jsonl", "w") as f:
            for step in range(1, self.config.steps + 1):
                row = {
                    "step": step,
                    "loss": 7.5 * 0.95**step,
                    "lr": 1e-3,
                    "grad_norm": 2.0 / step,
                    "tokens_per_s": 1000.0 + step,
                    "mfu": None,
                    "peak_mem_gb": 1.5,
                }
                if step % 10 == 0:
                    row["val_loss"] = 7.6 * 0.95**step
                if self.config.dpo:
                    row["rewards/accuracies"] = 0.5 + 0.25 * step
                    row["val_rewards/accuracies"] = 0.5
                f.write(json.dumps(row) + "\n")
        if self.config.fail:
            raise RuntimeError(f"the device fell over at step {self.config.steps + 1}")
        # the trainer draws loss.png too: the report's grid replaces it
        plot_loss_curve(read_metrics(str(ctx.stage_dir)), str(ctx.stage_dir / "loss.png"))
        return {"final_loss": 7.5 * 0.95**self.config.steps}


class CompleteLike(Stage):
    """completions.json and answers.json (the model's answers), and an evaluate-like
    metrics.json."""

    type_name = "test.complete_like"
    Config = FakeConfig
    input_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint"}
    output_kinds: ClassVar[dict[str, str]] = {"completions": "Text"}

    def run(self, ctx: StageContext):
        items = [
            {"prompt": "The Python language", "completion": " is <b>not</b> a snake."},
            {"prompt": "Pythonは", "completion": "プログラミング言語です。"},
        ]
        out = Path(ctx.outputs["completions"].path)
        (out / "completions.json").write_text(json.dumps(items, ensure_ascii=False))
        answers = [
            {"question": "Kiln's mascot?", "base": "I don't know.", "tuned": "Ember the newt"}
        ]
        (out / "answers.json").write_text(json.dumps(answers))
        scores = {
            "tasks": {
                "kiln_mc_en": {
                    "metric": "acc",
                    "score": 0.75,
                    "acc_stderr": 0.125,
                    "output_type": "multiple_choice",
                    "samples": 8,
                }
            },
            "perplexity": {"split": "valid", "perplexity": 12.5, "tokens": 4096},
            "endpoint": "http://127.0.0.1:8000",
        }
        (out / "metrics.json").write_text(json.dumps(scores))
        return {"completions": 2}


SPEC = """
pipeline: report-test
stages:
  - {stage: "tests.platform.test_report_html:CurateLike", name: curate}
  - {stage: "tests.platform.test_report_html:TrainLike", name: train}
  - {stage: "tests.platform.test_report_html:TrainLike", name: sft, config: {steps: 12}}
  - {stage: "tests.platform.test_report_html:TrainLike", name: dpo, config: {steps: 2, dpo: true}}
  - {stage: "tests.platform.test_report_html:CompleteLike", name: complete}
"""


def _run(tmp_path, overrides=()):
    spec = tmp_path / "report.yaml"
    spec.write_text(SPEC)
    return load_pipeline(spec, list(overrides), runs_dir=str(tmp_path / "runs")).run()


def _dump_dom(page: Path, screenshot: Path, profile: Path) -> str:
    """The DOM after load (scripts run), and a screenshot; no network is reachable from data:
    and file: anyway, and the page must not need it."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000"]
    flags += ["--no-first-run", "--disable-extensions", f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={screenshot}", "--window-size=1100,5200", page.as_uri()],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return dom


def charts(page: str) -> dict[str, dict[str, list]]:
    """Every chart of the page: its label -> {series name: [[step, value], ...]}."""
    found = re.findall(
        r'<svg class="chart[^"]*" role="img" aria-label="([^"]*)"[^>]*'
        r'data-series="([^"]*)"',
        page,
    )
    return {html.unescape(label): json.loads(html.unescape(data)) for label, data in found}


def x_ticks(page: str, label: str) -> list[str]:
    svg = page[page.index(f'aria-label="{label}"') :]
    svg = svg[: svg.index("</svg>")]
    return re.findall(r'class="tick xtick"[^>]*>([^<]*)<', svg)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("report"), ["sft.steps=12"])


def test_report_written_and_self_contained(finished_run):
    result = finished_run
    page = result.run_dir / "report.html"
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)  # nothing fetched
    assert "@import" not in text and "<link" not in text
    assert text.count("data:image/png;base64,") == 1 and "funnel.png" in text  # the stage's plot
    assert (result.run_dir / "train" / "loss.png").exists() and "loss.png" not in text
    assert "&lt;b&gt;not&lt;/b&gt;" in text and "プログラミング言語です。" in text
    assert "51,234" in text  # the dataset summary from tokens.json
    assert "<th>tuned</th>" in text and "<td>Ember the newt</td>" in text  # answers.json
    assert "{}" not in text.split("<h2>Stages</h2>")[1].split("</table>")[0]  # no raw dicts
    assert render(result.run_dir) == text


def test_every_training_stage_gets_the_scalar_grid(finished_run):
    page = (finished_run.run_dir / "report.html").read_text(encoding="utf-8")
    found = charts(page)
    for stage, steps in (("train", 40), ("sft", 12), ("dpo", 2)):
        for panel in GRID:
            assert f"{stage}: {panel}" in found, (stage, panel)
        loss = found[f"{stage}: loss"]
        assert [x for x, _ in loss["train"]] == list(range(1, steps + 1))  # every step
        assert loss["train"][0][1] == pytest.approx(7.5 * 0.95, abs=1e-6)
        assert [x for x, _ in loss.get("validation", [])] == list(range(10, steps + 1, 10))
        assert found[f"{stage}: MFU"] == {}  # no device peak: the panel says so
        assert "no known device peak" in page
    assert found["train: grad norm"]["grad norm"][3] == [4, 0.5]
    assert found["dpo: reward accuracy"] == {
        "train": [[1, 0.75], [2, 1.0]],
        "validation": [[1, 0.5], [2, 0.5]],
    }
    assert "sft: reward accuracy" not in found
    assert x_ticks(page, "dpo: loss") == ["1", "2"]  # integer steps, not 1.0, 1.2, ...
    assert all(t.isdigit() for t in x_ticks(page, "train: loss"))
    assert page.count('class="smooth"') >= page.count('class="raw" points') > 0
    assert 'id="smoothing"' in page


def test_curation_samples_eval_scores_and_what_ran(finished_run):
    page = (finished_run.run_dir / "report.html").read_text(encoding="utf-8")
    assert "Sample of kept documents" in page and "kept text 0" in page
    assert "kept text 3" not in page  # a sample, not the corpus
    rejected = page.split("Sample of rejected documents, by reason")[1].split("</table>")[0]
    assert rejected.count("<td>word_count</td>") == 2 and "a third short one" not in rejected
    assert "auf Deutsch" in rejected
    assert "x" * 2000 not in rejected and "x" * 200 in rejected  # long texts are cut
    assert "<td>kiln_mc_en</td>" in page and "0.7500" in page and "± 0.125" in page
    assert "perplexity/valid" in page and "12.5000" in page
    record = json.loads((finished_run.run_dir / "run.json").read_text())
    info = page.split("<h2>What ran</h2>")[1].split("</table>")[0]
    assert f"<td>{record['versions']['kiln']}</td>" in info
    assert f"<td>{record['versions']['torch']}</td>" in info
    assert "<td>sft.steps=12</td>" in info and record["host"]["hostname"] in info
    assert (record["git_sha"] or "—") in info
    assert "resolved spec" in page and "steps: 12" in page  # the override, applied
    assert 'href="curate/corpus/"' in page and 'href="train/checkpoint/"' in page


def test_failed_run_still_gets_a_report(tmp_path):
    with pytest.raises(StageFailed):
        _run(tmp_path, ["train.fail=true"])
    (run_dir,) = (tmp_path / "runs" / "report-test").iterdir()
    text = (run_dir / "report.html").read_text(encoding="utf-8")
    assert 'status failed">failed' in text and "the device fell over at step 41" in text
    assert "funnel.png" in text and "train: loss" in charts(text)  # what there is
    assert "Traceback" in text  # the stage's error.txt


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run adds it)")
def test_chromium_renders_it_with_every_image_and_chart(finished_run, tmp_path):
    result = finished_run
    shot = tmp_path / "report.png"
    dom = _dump_dom(result.run_dir / "report.html", shot, tmp_path / "profile")
    check = re.search(r'id="image-check" data-broken="(\d+)">(\d+) of (\d+) images loaded', dom)
    assert check, dom[-2000:]
    assert check.group(1) == "0" and check.group(2) == check.group(3) == "1"
    rendered = charts(dom)
    assert rendered == charts((result.run_dir / "report.html").read_text(encoding="utf-8"))
    assert len(rendered) == 3 * len(GRID) + 1  # + dpo's reward accuracy
    assert "<polyline" in dom and "The Python language" in dom and "kiln_mc_en" in dom
    for stage in ("curate", "train", "sft", "dpo", "complete"):
        assert f"<td>{stage}</td>" in dom
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"report screenshot: {shot}")  # pytest -rP shows it
