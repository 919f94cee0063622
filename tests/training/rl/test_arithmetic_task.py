"""The arithmetic RL task: seeded, disjoint splits, answers math_exact accepts, shipped files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import kiln.pipelines
from kiln.platform.cli import main
from kiln.platform.errors import ConfigError
from kiln.training.rl.prompts import load_prompts
from kiln.training.rl.rewards import RewardSet
from kiln.training.rl.tasks.arithmetic import ArithmeticConfig, evaluate, generate

DATA = Path(kiln.pipelines.__file__).parent / "data"
EXPRESSION = re.compile(r"Compute (.*)\. End your reply")


def _expression(row: dict) -> str:
    return EXPRESSION.match(row["prompt"])[1]


def test_the_shipped_files_are_what_the_generator_makes():
    splits = generate(ArithmeticConfig())
    for split, rows in splits.items():
        shipped = [json.loads(line) for line in (DATA / f"arithmetic_{split}.jsonl").open()]
        assert shipped == rows
    assert (len(splits["train"]), len(splits["held_out"])) == (512, 128)


def test_seeded_disjoint_and_answers_are_the_expressions_values():
    cfg = ArithmeticConfig(seed=3, train=200, held_out=50)
    splits = generate(cfg)
    assert generate(cfg) == splits
    assert generate(cfg.model_copy(update={"seed": 4})) != splits
    train = {_expression(r) for r in splits["train"]}
    held_out = {_expression(r) for r in splits["held_out"]}
    assert len(train) == 200 and len(held_out) == 50 and not train & held_out
    for row in splits["train"] + splits["held_out"]:
        expression = _expression(row)
        assert int(row["answer"]) == eval(expression)  # noqa: S307 - our own generated integers


def test_math_exact_checks_every_answer():
    rows = generate(ArithmeticConfig())["held_out"]
    rewards = RewardSet.from_specs([{"name": "math_exact"}])
    prompts = [r["prompt"] for r in rows]
    right = [f"Let me compute.\nAnswer: {r['answer']}" for r in rows]
    wrong = [f"Answer: {int(r['answer']) + 1}" for r in rows]
    assert [r.total for r in rewards.score(prompts, right, rows)] == [1.0] * len(rows)
    assert [r.total for r in rewards.score(prompts, wrong, rows)] == [0.0] * len(rows)


def test_difficulty_knobs():
    rows = generate(ArithmeticConfig(digits=1, terms=4, operations=["+"], train=30, held_out=5))
    for row in rows["train"]:
        tokens = _expression(row).split()
        assert len(tokens) == 7 and set(tokens[1::2]) == {"+"}
        assert all(len(t) == 1 for t in tokens[::2])
    assert evaluate("2 + 3 * 4 - 5") == 9


def test_too_few_distinct_problems_is_a_config_error():
    with pytest.raises(ConfigError, match="only .* distinct problems"):
        generate(ArithmeticConfig(digits=1, terms=2, operations=["+"], train=90, held_out=20))


def test_cli_writes_both_splits(tmp_path, capsys):
    out = tmp_path / "task"
    args = ["rl-task", "arithmetic", "--out", str(out), "--train", "5", "--held-out", "3"]
    assert main([*args, "--operations", "+-", "--seed", "7"]) == 0
    train, held_out = (
        load_prompts(str(out / "train.jsonl")),
        load_prompts(str(out / "held_out.jsonl")),
    )
    assert (len(train), len(held_out)) == (5, 3)
    assert all("*" not in r["prompt"] for r in train + held_out)
    assert main([*args, "--operations", "+/"]) == 2
    assert "operations.1" in capsys.readouterr().err
