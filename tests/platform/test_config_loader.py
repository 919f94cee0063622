"""The one config loader: `kiln run`, `kiln train`, `kiln curate` and the torchrun entry report a
bad file, an unknown field, a wrong type and a bad override as one line naming file and field."""

from __future__ import annotations

import re

import pytest

from kiln.platform.cli import main
from kiln.platform.config import load_config
from kiln.platform.errors import ConfigError
from kiln.training.config import TrainConfig

RUN = "pipeline: p\nstages:\n  - stage: text.stats\n    config: {top_words: 3}\n"
TRAIN = "train:\n  steps: 5\n  parallel: {tp: 1}\n"
CURATE = "curate:\n  filters: {min_words: 3}\n"

# (command, good file) -> each case: (file text or None for the good one, --set items, error)
CASES = {
    "bad-yaml": ("key: [1, 2\n", [], r"cfg\.yaml: line \d+, column \d+: invalid YAML"),
    # a bad value an override put there is blamed on that --set, not on the file
    "unknown-field": (None, ["{field}=1"], r"--set {field}=1: unknown field"),
    "wrong-type": (None, ["{typed}=lots"], r"--set {typed}=lots: .*\(got 'lots'\)"),
    "bad-override": (None, ["no_equals_sign"], r"--set 'no_equals_sign': expected KEY=VALUE"),
}
COMMANDS = {
    # command: (argv before the file, good file, prefix in errors, unknown key, typed key)
    "run": (["run"], RUN, r"text\.stats\.", "text.stats.colour", "text.stats.top_words"),
    "train": (["train", "--config"], TRAIN, r"train\.", "colour", "steps"),
    "curate": (
        ["curate", "--input", "x.jsonl", "--output", "out", "--config"],
        CURATE,
        r"curate\.",
        "colour",
        "actors",
    ),
}


def _expected(pattern: str, prefix: str, typed: str, unknown: str = "") -> str:
    return (
        pattern.replace("{prefix}", prefix)
        .replace("{typed}", re.escape(typed))
        .replace("{field}", re.escape(unknown))
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_one_line_error_through_the_cli(command, case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv, good, prefix, unknown, typed = COMMANDS[command]
    text, sets, pattern = CASES[case]
    (tmp_path / "cfg.yaml").write_text(text if text is not None else good)
    sets = [s.replace("{field}", unknown).replace("{typed}", typed) for s in sets]
    overrides = [a for s in sets for a in ("--set", s)]
    assert main([*argv, "cfg.yaml", *overrides]) == 2
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if line.startswith("kiln: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    assert re.search(_expected(pattern, prefix, typed, unknown), errors[0]), errors[0]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("train: {steps: [\n", r"cfg\.yaml: line \d+, column \d+: invalid YAML"),
        ("train: {stepz: 3}\n", r"cfg\.yaml: stepz: unknown field"),
        ("steps: lots\n", r"cfg\.yaml: steps: .*integer.*\(got 'lots'\)"),
    ],
)
def test_torchrun_entry_reports_one_line(text, expected, tmp_path, capsys):
    from kiln.training import torchrun_main

    (tmp_path / "cfg.yaml").write_text(text)
    assert torchrun_main.main(["--config", str(tmp_path / "cfg.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and re.search(expected, err), err


def test_block_fields_and_nested_overrides(tmp_path):
    (tmp_path / "t.yaml").write_text("train:\n  steps: 5\n  optimizer: {lr: 0.1}\n")
    cfg = load_config(
        TrainConfig,
        tmp_path / "t.yaml",
        block="train",
        fields={"log_every": 2, "seed": None},
        overrides=["optimizer.lr=3e-4", "parallel.tp=2", "data.paths=[a, b]"],
    )
    assert (cfg.steps, cfg.log_every, cfg.optimizer.lr, cfg.parallel.tp) == (5, 2, 3e-4, 2)
    assert cfg.data.paths == ["a", "b"] and cfg.seed == TrainConfig().seed
    with pytest.raises(ConfigError, match=r"--set steps\.x: steps is not a mapping"):
        load_config(TrainConfig, tmp_path / "t.yaml", block="train", overrides=["steps.x=1"])
    with pytest.raises(ConfigError, match=r"t\.yaml: expected a mapping"):
        (tmp_path / "t.yaml").write_text("- 1\n- 2\n")
        load_config(TrainConfig, tmp_path / "t.yaml")
