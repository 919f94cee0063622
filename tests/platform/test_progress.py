"""Progress of long work: on a terminal a live bar with ETA that log lines are written around
and that clears itself (no line added); off a terminal the run log only. Curate, tokenize,
post-training steps and export report through it."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.platform import console
from kiln.platform import terminal as terminal_state


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Call it in the test body (pytest sets its own sys.stderr for the call phase)."""

    def start() -> _Terminal:
        term = _Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        return term

    monkeypatch.setattr(console.Progress, "delay_s", 0.0)
    monkeypatch.setattr(console.Progress, "refresh_s", 0.0)  # every update redraws
    console.configure(verbose=False)
    yield start
    logging.captureWarnings(False)


@pytest.fixture
def recorded(monkeypatch):
    """Every Progress made (subclasses too, wherever the class was imported), with `seen`: the
    `done` of each update."""
    made = []
    init, update = console.Progress.__init__, console.Progress.update

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.seen = []
        made.append(self)

    def recording_update(self, done, postfix=""):
        self.seen.append(done)
        update(self, done, postfix)

    monkeypatch.setattr(console.Progress, "__init__", recording_init)
    monkeypatch.setattr(console.Progress, "update", recording_update)
    return made


def test_a_terminal_gets_a_live_bar_with_eta_that_adds_no_line(terminal):
    term = terminal()
    with console.Progress(4, "tokenize", unit="documents") as progress:
        progress.advance(1, "10 tokens")
        progress.advance(1, "20 tokens")
        logging.getLogger("kiln").info("stage tokenize: a line while the bar runs")
        progress.update(4, "40 tokens")
        assert terminal_state.live_bars  # the handler writes around it
    out = term.getvalue()
    assert "tokenize:" in out and "2/4" in out and "20 tokens" in out, out
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", out), out  # elapsed<ETA
    # the one log line is the only newline: the bar redraws in place and clears at the end
    assert out.count("\n") == 1 and "a line while the bar runs\n" in out, out
    assert out.endswith("\r") and not out.split("\r")[-2].strip(), repr(out[-80:])  # cleared
    assert not terminal_state.live_bars


def test_off_a_terminal_progress_goes_to_the_run_log_only(capsys, tmp_path):
    console.configure(verbose=False)
    handler = console.attach_run_log(tmp_path)
    try:
        with console.Progress(3, "export", unit="formats", every_s=0.0) as progress:
            for _ in range(3):
                progress.advance(1, "hf")
    finally:
        console.detach_run_log(handler)
        logging.captureWarnings(False)
    assert "export:" not in capsys.readouterr().err
    assert "export: 3/3 formats (hf), ETA 0:00" in (tmp_path / "logs" / "kiln.log").read_text()


def _corpus(folder, n: int) -> str:
    folder.mkdir(parents=True)
    texts = [f"document number {i} says something" for i in range(n)]
    table = pa.table({"id": [str(i) for i in range(n)], "text": texts})
    pq.write_table(table, folder / "shard-00000.parquet", row_group_size=4)
    return str(folder)


def test_tokenize_reports_documents_with_tokens(recorded, tmp_path):
    from kiln.training.data.stages import tokenize_inline
    from kiln.training.data.tokenizer import train_tokenizer

    corpus = _corpus(tmp_path / "corpus", 10)
    tok = train_tokenizer(["document number says something"] * 4, 300, ["<|eod|>"], 1)
    counts = tokenize_inline(
        corpus,
        str(tmp_path / "tokens"),
        tok.to_str(),
        eod_id=0,
        vocab_size=tok.get_vocab_size(),
        seed=1,
        valid_fraction=0.0,
        test_fraction=0.0,
        batch_size=4,
    )
    (progress,) = recorded
    assert (progress.desc, progress.unit, progress.total) == ("tokenize", "documents", 10)
    assert progress.seen == [4, 8, 10]  # one update per batch, in documents
    assert progress.tokens == counts["train"]["tokens"]


def test_curate_reports_input_bytes_with_documents(recorded, tmp_path):
    from kiln.curator.config import CurateConfig
    from kiln.curator.pipeline import curate

    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(3):
        rows = [{"id": f"{i}-{j}", "text": f"file {i} line {j} " + "words " * 20} for j in range(5)]
        (inputs / f"part{i}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = CurateConfig.model_validate(
        {
            "input": [str(inputs)],
            "stream": "inline",
            "cluster": "local",
            "filters": {"languages": None},
            "output": {"plot": False},
        }
    )
    report = curate(cfg, str(tmp_path / "out"), runtime=None)
    (progress,) = recorded
    sizes = [(inputs / f"part{i}.jsonl").stat().st_size for i in range(3)]
    assert (progress.desc, progress.unit, progress.total) == ("curate", "B", sum(sizes))
    assert progress.seen == [sizes[0], sizes[0] + sizes[1], sum(sizes)]  # each file as it ends
    assert report["documents_in"] == 15


def test_export_reports_each_format(recorded, tmp_path):
    from kiln.serving.export.stages import ExportConfig, export_model
    from tests.serving.rest.tiny_model import make_tiny_model

    src = make_tiny_model(str(tmp_path / "src"))
    export_model(src, str(tmp_path / "out"), ExportConfig(formats=["hf"]))
    (progress,) = recorded
    assert (progress.desc, progress.total, progress.seen) == ("export", 1, [1])


def test_sft_reports_its_steps_with_the_loss(recorded, monkeypatch, tmp_path):
    from types import SimpleNamespace

    import kiln.training.post.stages as post_stages
    from kiln.training.post.stages import SFTStage

    def train_post(cfg, export_dir=None, on_step=None):  # the trainer's per-step callback
        os.makedirs(cfg.checkpoint.dir, exist_ok=True)
        for step in (1, 2, 3):
            on_step({"step": step, "loss": 2.0 / step})
        return {"steps": 3, "final": {"step": 3, "loss": 0.5}}

    monkeypatch.setattr(post_stages, "train_post", train_post)
    stage = SFTStage({"seq_len": 32, "global_batch_size": 2, "micro_batch_size": 2, "steps": 3})
    out = SimpleNamespace(path=str(tmp_path / "model"), counts={}, meta={})
    ctx = SimpleNamespace(inputs={}, outputs={"model": out}, work_dir=tmp_path, stage_dir=tmp_path)
    assert stage.run(ctx)["steps"] == 3
    (progress,) = recorded
    assert (progress.desc, progress.unit, progress.total, progress.seen) == (
        "sft",
        "steps",
        3,
        [1, 2, 3],
    )
