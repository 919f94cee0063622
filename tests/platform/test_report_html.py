"""report.html: written by every `Pipeline.run` (also a failed one) from what the stages left —
the curator's report.json and funnel.png, the trainer's metrics.jsonl and loss.png, tokens.json,
completions.json — and rendered by headless Chromium with every image loaded and no request
leaving the page. Skips when Debian's `chromium` is absent."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import ClassVar

import pytest

from kiln.curator.report import build_report, plot_funnel
from kiln.platform.errors import StageFailed
from kiln.platform.pipeline import Pipeline
from kiln.platform.report_html import render
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.metrics_log import plot_loss_curve, read_metrics

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class FakeConfig(StageConfig):
    fail: bool = False
    plot: bool = True


class CurateLike(Stage):
    """Writes what the curate stage writes: report.json (the curator's own builder), funnel.png."""

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
        ctx.outputs["corpus"].counts = {"documents": 100, "rejected": 20}
        return {"documents": 100, "docs_per_s": 80.0}


class TrainLike(Stage):
    """metrics.jsonl (one line a step) and loss.png in the stage folder, as the trainer does."""

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
            for step in range(1, 41):
                f.write(json.dumps({"step": step, "loss": 7.5 * 0.95**step, "lr": 1e-3}) + "\n")
        if self.config.fail:
            raise RuntimeError("the device fell over at step 41")
        if self.config.plot:  # the trainer draws loss.png at the end; SFT-like stages may not
            plot_loss_curve(read_metrics(str(ctx.stage_dir)), str(ctx.stage_dir / "loss.png"))
        return {"final_loss": 7.5 * 0.95**40}


class CompleteLike(Stage):
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
        return {"completions": 2}


def _pipeline(tmp_path, fail=False) -> Pipeline:
    stages = [
        CurateLike(name="curate"),
        TrainLike(name="train", fail=fail),
        TrainLike(name="sft", plot=False),
        CompleteLike(name="complete"),
    ]
    return Pipeline("report-test", stages, runs_dir=tmp_path / "runs")


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
        [CHROMIUM, *flags, f"--screenshot={screenshot}", "--window-size=1100,2400", page.as_uri()],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return dom


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("report")).run()


def test_report_written_and_self_contained(finished_run):
    result = finished_run
    page = result.run_dir / "report.html"
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)  # nothing fetched
    assert "@import" not in html and "<link" not in html
    assert html.count("data:image/png;base64,") == 2  # funnel.png and loss.png
    assert "funnel.png" in html and "loss.png" in html and "word_count" in html
    assert "Loss (sft/metrics.jsonl)" in html and "Loss (train/" not in html  # no plot twice
    assert "&lt;b&gt;not&lt;/b&gt;" in html and "プログラミング言語です。" in html
    assert "51,234" in html  # the dataset summary from tokens.json
    assert "<th>tuned</th>" in html and "<td>Ember the newt</td>" in html  # answers.json
    assert render(result.run_dir) == html


def test_failed_run_still_gets_a_report(tmp_path):
    with pytest.raises(StageFailed):
        _pipeline(tmp_path, fail=True).run()
    (run_dir,) = (tmp_path / "runs" / "report-test").iterdir()
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert 'status failed">failed' in html and "the device fell over at step 41" in html
    assert "funnel.png" in html and "Loss (train/metrics.jsonl)" in html  # what there is
    assert "Traceback" in html  # the stage's error.txt


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run adds it)")
def test_chromium_renders_it_with_every_image_loaded(finished_run, tmp_path):
    result = finished_run
    shot = tmp_path / "report.png"
    dom = _dump_dom(result.run_dir / "report.html", shot, tmp_path / "profile")
    check = re.search(r'id="image-check" data-broken="(\d+)">(\d+) of (\d+) images loaded', dom)
    assert check, dom[-2000:]
    assert check.group(1) == "0" and check.group(2) == check.group(3) == "2"
    assert dom.count("<svg") == 1 and "<polyline" in dom and "The Python language" in dom
    for stage in ("curate", "train", "sft", "complete"):
        assert f"<td>{stage}</td>" in dom
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
