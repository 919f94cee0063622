"""`kiln grpo`: YAML + --set -> a Checkpoint that Generator.load (and so export/serve) reads."""

import argparse
import json
import os

import pytest
import torch

from kiln.engine.generator import Generator
from kiln.model.formats.hf import write_hf_dir
from kiln.platform.errors import ConfigError
from kiln.platform.imports import import_object
from kiln.training.rl import cli
from tests.engine.tiny import tiny_model, train_tokenizer


def _setup(tmp_path):
    """A tiny base, two prompts, a grpo.yaml and the parser: (model, config path, parser)."""
    tok = train_tokenizer()
    model = tiny_model("llama", tok.get_vocab_size())
    write_hf_dir(model.cfg, model.state_dict(), str(tmp_path / "base"), tok=tok, tok_dir=None)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the", "hello")))
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"grpo:\n  base: {tmp_path / 'base'}\n  prompts: {prompts}\n  eval_prompts: {prompts}\n"
        "  rewards: [{name: regex, params: {pattern: 'o'}}]\n"
        "  steps: 5\n  group_size: 4\n  prompts_per_step: 2\n  max_new_tokens: 4\n"
    )
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return model, config, parser


def test_grpo_command_writes_a_loadable_checkpoint(tmp_path, capsys, malloc_tuned):
    model, config, parser = _setup(tmp_path)
    out = tmp_path / "out"
    args = parser.parse_args(
        ["grpo", "--config", str(config), "--set", "steps=2", "--out", str(out)]
    )
    assert import_object(args.handler)(args) == 0
    assert malloc_tuned == [1]  # the command's process keeps freed memory (conftest.py)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert len(lines) == 2 and "lp-mismatch" in lines[0]  # --set overrode the file's steps
    run = json.loads((out / "run.json").read_text())
    assert len(run["metrics"]) == 2 and run["config"]["group_size"] == 4
    assert 0 <= run["eval_reward_before"] <= 1 and 0 <= run["eval_reward_after"] <= 1
    assert os.path.exists(out / "tokenizer.json")
    loaded = Generator.load(str(out))
    trained = loaded.model.state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in model.state_dict().items())


def test_grpo_command_samples_ahead_with_max_policy_lag(tmp_path, capsys):
    _, config, parser = _setup(tmp_path)
    out = tmp_path / "out"
    argv = ["grpo", "--config", str(config), "--set", "steps=3", "--out", str(out)]
    args = parser.parse_args([*argv, "--set", "max_policy_lag=1"])
    assert import_object(args.handler)(args) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert [line.split("| lag ")[1][0] for line in lines] == ["0", "1", "1"]
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["max_policy_lag"] == 1
    assert [m["policy_lag"] for m in run["metrics"]] == [0.0, 1.0, 1.0]
    args = parser.parse_args([*argv, "--set", "max_policy_lag=1", "--set", "tis_cap=null"])
    with pytest.raises(ConfigError, match=r"^tis_cap: max_policy_lag > 0 needs"):
        import_object(args.handler)(args)
