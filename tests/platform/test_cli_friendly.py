"""The CLI as people's other tools behave: "did you mean", `--set` blamed for its own typo, a
pipeline spec given to a stage command, `-v` anywhere, `--out`/`--output`, `kiln stages [NAME]`."""

from __future__ import annotations

import pytest

from kiln.platform.cli import build_parser, main

SPEC = """pipeline: p
stages:
  - stage: text.read
    config: {paths: [spec.yaml]}
  - stage: text.stats
    name: stats
    config: {top_words: 3}
"""


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no error printed"
    return err[-1]


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(SPEC)
    return "spec.yaml"


def test_unknown_command_suggests_the_nearest(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["rnu", "spec.yaml"])
    assert exit_.value.code == 2
    assert "invalid choice: 'rnu' (did you mean 'run'?)" in _error(capsys)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "spec.yaml", "--runs-dri", "x"])
    assert exit_.value.code == 2
    assert _error(capsys).endswith("--runs-dri x (did you mean '--runs-dir'?)")


def test_unknown_stage_and_field_suggest_the_nearest(spec, tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text(SPEC.replace("top_words: 3", "top_wrds: 3"))
    assert main(["run", "typo.yaml"]) == 2
    assert _error(capsys) == (
        "kiln: error: typo.yaml: stats.top_wrds: unknown field (did you mean 'top_words'?)"
    )
    (tmp_path / "stage.yaml").write_text(SPEC.replace("text.read", "text.raed"))
    assert main(["run", "stage.yaml"]) == 2
    assert "unknown stage 'text.raed' (did you mean 'text.read'?)" in _error(capsys)
    assert main(["stages", "trian"]) == 2
    assert "(did you mean 'train'?)" in _error(capsys)


def test_a_set_typo_is_blamed_on_set_not_the_file(spec, capsys):
    assert main(["run", spec, "--set", "stats.top_wrods=4"]) == 2
    err = _error(capsys)
    assert err == "kiln: error: --set stats.top_wrods=4: unknown field (did you mean 'top_words'?)"
    assert main(["run", spec, "--set", "stats.top_words=many"]) == 2
    err = _error(capsys)
    assert err.startswith("kiln: error: --set stats.top_words=many: ") and "spec.yaml" not in err
    assert main(["run", spec, "--set", "stats={top_words: 4}"]) == 2
    assert _error(capsys) == (
        "kiln: error: --set stats: name a field of stage 'stats' (--set stats.FIELD=VALUE)"
    )
    assert main(["run", spec, "--set", "stast.top_words=4"]) == 2
    assert "no stage named 'stast' (did you mean 'stats'?)" in _error(capsys)


@pytest.mark.parametrize("command", ["train", "sft", "curate"])
def test_stage_command_set_typo_and_pipeline_spec(command, spec, tmp_path, capsys):
    argv = {
        "train": ["train", "--config"],
        "sft": ["sft", "--config"],
        "curate": ["curate", "--input", "x", "--out", "o", "--config"],
    }[command]
    (tmp_path / "cfg.yaml").write_text("{}\n")
    field, typo = ("actors", "actros") if command == "curate" else ("steps", "stpes")
    assert main([*argv, "cfg.yaml", "--set", f"{typo}=40"]) == 2
    assert _error(capsys) == (
        f"kiln: error: --set {typo}=40: unknown field (did you mean {field!r}?)"
    )
    if command == "train":  # a mapping given whole: the field inside it is named
        assert main([*argv, "cfg.yaml", "--set", "parallel={tp: many}"]) == 2
        assert _error(capsys).startswith("kiln: error: --set parallel={tp: many}: tp: ")
    assert main([*argv, spec]) == 2
    assert _error(capsys) == (
        "kiln: error: spec.yaml: this is a pipeline spec: use `kiln run spec.yaml`"
    )


def test_verbose_after_the_command_and_out_or_output():
    parser = build_parser()
    assert parser.parse_args(["run", "spec.yaml", "-v"]).verbose is True
    assert parser.parse_args(["-v", "run", "spec.yaml"]).verbose is True
    assert parser.parse_args(["run", "spec.yaml"]).verbose is False
    assert parser.parse_args(["curate", "--input", "i", "--out", "o"]).output == "o"
    assert parser.parse_args(["curate", "--input", "i", "--output", "o"]).output == "o"
    assert parser.parse_args(["tokenize", "c", "--output", "o"]).out == "o"
    assert parser.parse_args(["train", "--config", "c", "--out", "o"]).run_dir == "o"
    assert parser.parse_args(["sft", "--config", "c", "--out", "o"]).export == "o"


def test_stages_lists_user_stages_and_presets(capsys):
    assert main(["stages"]) == 0
    out = capsys.readouterr().out
    names = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert {"curate", "tokenize", "train", "sft", "serve"} <= names
    assert not {"noop", "text.stats"} & names
    assert "Model presets" in out and "llama3_8b" in out and "32 layers" in out


def test_stages_name_shows_type_default_and_description(capsys):
    assert main(["stages", "train"]) == 0
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.startswith("steps "))
    assert row.split()[1:3] == ["int", "10"], row
    assert "Optimizer steps to train for" in row, row
