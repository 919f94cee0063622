"""`kiln distill` and the `distill` stage: YAML + --set -> a Checkpoint Generator.load reads,
run.json with every step and the held-out reverse KL; a teacher with another tokenizer is a
one-line ConfigError naming the field."""

import argparse
import json

import pytest
import torch

from kiln.engine.generator import Generator
from kiln.model.formats.hf import write_hf_dir
from kiln.platform.errors import ConfigError
from kiln.platform.imports import import_object
from kiln.platform.pipeline import Pipeline
from kiln.platform.registry import stage_class
from kiln.training.rl import cli
from tests.engine.tiny import tiny_model, train_tokenizer


def _models(tmp_path):
    tok = train_tokenizer()
    student = tiny_model("llama", tok.get_vocab_size(), seed=1)
    for name, seed in (("student", 1), ("teacher", 2)):
        model = tiny_model("llama", tok.get_vocab_size(), seed=seed)
        write_hf_dir(model.cfg, model.state_dict(), str(tmp_path / name), tok=tok, tok_dir=None)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the", "hello", "ray")))
    return student, prompts


def _config(tmp_path, prompts, teacher="teacher"):
    config = tmp_path / "distill.yaml"
    config.write_text(
        f"distill:\n  base: {tmp_path / 'student'}\n  teacher: {tmp_path / teacher}\n"
        f"  prompts: {prompts}\n  eval_prompts: {prompts}\n  prompt_format: raw\n"
        "  steps: 6\n  prompts_per_step: 2\n  max_new_tokens: 6\n"
        "  optimizer: {lr: 0.03, weight_decay: 0.0}\n"
    )
    return config


def _command(argv):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return import_object(args.handler)(args)


def test_distill_command_writes_a_loadable_checkpoint(tmp_path, capsys, malloc_tuned):
    student, prompts = _models(tmp_path)
    config, out = _config(tmp_path, prompts), tmp_path / "out"
    argv = ["distill", "--config", str(config), "--set", "steps=3", "--out", str(out)]
    assert _command(argv) == 0
    assert malloc_tuned == [1]  # the command's process keeps freed memory (conftest.py)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert len(lines) == 3 and "reverse-kl" in lines[0]  # --set overrode the file's steps
    run = json.loads((out / "run.json").read_text())
    assert len(run["metrics"]) == 3 and run["config"]["divergence"] == "reverse_kl"
    assert run["eval_reverse_kl_after"] < run["eval_reverse_kl_before"]
    trained = Generator.load(str(out)).model.state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in student.state_dict().items())


def test_a_teacher_with_another_tokenizer_is_a_config_error(tmp_path):
    _, prompts = _models(tmp_path)
    other = train_tokenizer()
    other.add_tokens(["zz"])  # the models agree in size, the vocabularies do not
    teacher = tiny_model("llama", train_tokenizer().get_vocab_size(), seed=3)
    write_hf_dir(
        teacher.cfg, teacher.state_dict(), str(tmp_path / "other"), tok=other, tok_dir=None
    )
    config = _config(tmp_path, prompts, teacher="other")
    with pytest.raises(ConfigError, match=r"distill\.teacher: .*tokenizer differs"):
        _command(["distill", "--config", str(config), "--out", str(tmp_path / "out")])


def test_distill_stage_records_every_step(tmp_path):
    _, prompts = _models(tmp_path)
    stage = stage_class("distill")(
        base=str(tmp_path / "student"),
        teacher=str(tmp_path / "teacher"),
        prompts=str(prompts),
        prompt_format="raw",
        steps=2,
        prompts_per_step=2,
        max_new_tokens=4,
    )
    result = Pipeline("distill-test", [stage], runs_dir=str(tmp_path / "runs")).run(shutdown=False)
    assert result.record["status"] == "succeeded"
    rows = [json.loads(x) for x in (result.run_dir / "distill" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2] and all("reverse_kl" in r for r in rows)
    assert result.artifact("distill.checkpoint").meta["objective"] == "distill"


def test_rollout_workers_make_the_stages_ask_for_ray():
    for name in ("distill", "grpo"):
        fields = {"rewards": [{"name": "math_exact"}]} if name == "grpo" else {}
        local = stage_class(name)(**fields)
        on_ray = stage_class(name)(**fields, rollout={"workers": 2, "cpus_per_worker": 0.5})
        assert local.needs().ray is False
        assert on_ray.needs().ray is True and on_ray.needs().cpus == 1.0
