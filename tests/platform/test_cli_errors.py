"""Bad input: one line naming the field or file, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kiln.platform.cli import main


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("pipeline: p\nstages: [\n", r"spec\.yaml: line \d+, column \d+: invalid YAML"),
        (
            "pipeline: p\nstages:\n  - stage: no.such.stage\n",
            r"stages\[0\]: unknown stage 'no\.such\.stage'",
        ),
        (
            "pipeline: p\nstages:\n  - stage: text.stats\n    config: {top_words: lots}\n",
            r"text\.stats\.top_words: .*integer.*\(got 'lots'\)",
        ),
        (
            "pipeline: p\nstages:\n  - stage: text.stats\n    config: {colour: red}\n",
            r"text\.stats\.colour: unknown field",
        ),
        (
            "pipeline: p\nstages:\n  - stage: text.read\n    config: {paths: [/no/such/dir]}\n",
            r"text\.read\.paths: /no/such/dir: no such file or directory",
        ),
        ("pipeline: p\nstagez: []\n", r"spec\.yaml: .*stagez: unknown field"),
    ],
    ids=[
        "bad-yaml",
        "unknown-stage",
        "wrong-type",
        "unknown-field",
        "missing-input-file",
        "unknown-top-key",
    ],
)
def test_bad_spec_is_one_line_and_exit_2(tmp_path, capsys, spec, expected, monkeypatch):
    import re

    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(spec)
    assert main(["run", "spec.yaml", "--runs-dir", str(tmp_path / "runs")]) == 2
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if line.startswith("kiln: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines  # progress logs may come first
    err = errors[0]
    assert re.search(expected, err), err
    assert not any("Traceback" in line for line in lines)


def test_missing_spec_and_bad_set(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: spec file not found" in capsys.readouterr().err
    (tmp_path / "s.yaml").write_text("pipeline: p\nstages:\n  - stage: noop\n")
    assert main(["run", str(tmp_path / "s.yaml"), "--set", "other.tag=x"]) == 2
    assert "--set other.tag: no stage named 'other'" in capsys.readouterr().err


def test_real_process_exit_code_and_single_line(tmp_path):
    (tmp_path / "spec.yaml").write_text(
        "pipeline: p\nstages:\n  - stage: text.stats\n    config: {top_words: -1}\n"
    )
    out = subprocess.run(
        check=False,
        args=[sys.executable, "-m", "kiln", "run", "spec.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "text.stats.top_words" in out.stderr
