"""Built-in rewards (positive and negative cases), weights, user functions, failures as 0."""

from __future__ import annotations

import pytest

from kiln.platform.errors import ConfigError
from kiln.training.rl.rewards import RewardSet
from kiln.training.rl.rewards.math_answer import extract_answer

P = "prompt"


def score(spec: dict, completion: str, row: dict | None = None):
    return RewardSet.from_specs([spec]).score([P], [completion], [row or {}])[0]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She has 3 apples, then 5 more, so 8 apples.", "8"),
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("#### 1,234\nI hope this helps, see step 2.", "1,234"),
        ("The temperature drops to -7 degrees.", "-7"),
        ("So the total is $1,000.50.", "$1,000.50"),
        ("We get \\boxed{42} after 3 steps.", "42"),
        ("Thus \\boxed{\\frac{3}{4}} (step 2)", "3/4"),
        ("The answer is 17. Check: 17 - 2 = 15", "17"),
        ("The answers are 3 and 4", "4"),
        ("Answer: -12\nbecause 3 * -4 = -12 and 9 > 2", "-12"),
        ("no digits here", None),
    ],
)
def test_final_answer_extraction_as_gsm8k_graders_do(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "completion, answer, value",
    [
        ("... so 1,000 in total. #### 1000", "1000", 1.0),
        ("the result is \\boxed{-3}", -3, 1.0),
        ("12.0", "12", 1.0),
        ("Answer: 41", "42", 0.0),
        ("7 + 5 = 12. Answer: 12", "She earns 7 + 5 = 12 dollars.\n#### 12", 1.0),
    ],
)
def test_math_exact(completion, answer, value):
    result = score({"name": "math_exact"}, completion, {"answer": answer})
    assert result.total == value and result.parts == {"math_exact": value}


def test_math_exact_without_a_number_scores_zero_with_the_reason():
    result = score({"name": "math_exact"}, "I do not know.", {"answer": "3"})
    assert result.total == 0.0 and result.failures == {"math_exact": "no number in the completion"}


def test_regex_search_and_full_match():
    think = {
        "name": "regex",
        "params": {"pattern": r"<think>.*</think>\s*Answer: \d+", "match": "full"},
    }
    assert score(think, "<think>2+2</think> Answer: 4\n").total == 1.0
    assert score(think, "Answer: 4 <think></think>").total == 0.0
    search = {"name": "regex", "params": {"pattern": "answer", "ignore_case": True}}
    assert score(search, "The ANSWER is 4").total == 1.0
    assert score(search, "4").total == 0.0


def test_json_schema_inline_and_from_the_row():
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    spec = {"name": "json_schema", "params": {"schema": schema}}
    assert score(spec, 'Here:\n```json\n{"name": "Ada", "age": 36}\n```').total == 1.0
    bad_type = score(spec, '{"name": "Ada", "age": "old"}')
    assert bad_type.total == 0.0 and bad_type.failures["json_schema"].startswith("schema: age:")
    assert score(spec, "{name: Ada}").failures["json_schema"].startswith("not JSON:")
    from_row = {"name": "json_schema", "params": {"schema_field": "schema"}}
    assert score(from_row, '{"name": "x", "age": 1}', {"schema": schema}).total == 1.0
    assert score(from_row, '{"name": "x"}', {"schema": schema}).total == 0.0


def test_length_penalty_target_and_overlong():
    target = {"name": "length_penalty", "params": {"target": 10}}
    assert score(target, "x" * 10).total == 0.0
    assert score(target, "x" * 15).total == pytest.approx(-0.5)
    assert score(target, "x" * 100).total == -1.0
    overlong = {"name": "length_penalty", "params": {"max": 8, "buffer": 4, "unit": "words"}}
    assert score(overlong, "w " * 4).total == 0.0
    assert score(overlong, "w " * 6).total == pytest.approx(-0.5)
    assert score(overlong, "w " * 9).total == -1.0


def test_weights_combine_and_parts_are_kept():
    rewards = RewardSet.from_specs(
        [
            {"name": "math_exact", "weight": 2.0},
            {"name": "regex", "weight": 0.5, "params": {"pattern": r"Answer: \d+$"}},
            {"name": "regex", "weight": -1.0, "params": {"pattern": "sorry"}},
        ]
    )
    assert rewards.names == ["math_exact", "regex", "regex_2"]
    good, wrong = rewards.score([P, P], ["Answer: 5", "sorry. Answer: 4"], [{"answer": 5}] * 2)
    assert good.total == 2.5 and good.parts == {"math_exact": 1.0, "regex": 1.0, "regex_2": 0.0}
    assert wrong.total == -0.5


def test_user_function_with_params_and_a_raising_reward_is_zero_with_its_reason():
    rewards = RewardSet.from_specs(
        [
            {"function": "tests.training.rl.user_rewards:brevity", "params": {"limit": 3}},
            {"function": "tests.training.rl.user_rewards:broken"},
            {"name": "math_exact"},
        ]
    )
    short, long_ = rewards.score([P, P], ["7", "seven is 7"], [{"answer": 7}, {}])
    assert short.parts == {
        "tests.training.rl.user_rewards:brevity": 1.0,
        "tests.training.rl.user_rewards:broken": 0.0,
        "math_exact": 1.0,
    }
    assert short.failures == {
        "tests.training.rl.user_rewards:broken": "RuntimeError: the reward has a bug on two lines"
    }
    assert long_.total == 0.0
    assert long_.failures["math_exact"] == "KeyError: \"row has no 'answer' field\""


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"function": "tests.training.rl.no_such_module:f"}, "rewards[0].function: cannot import"),
        ({"function": "tests.training.rl.user_rewards:missing"}, "rewards[0].function: "),
        ({"function": "tests.training.rl.user_rewards:NOT_A_FUNCTION"}, "has no function"),
        ({"function": "no_colon"}, "expected 'module:function'"),
        ({"name": "exact"}, "rewards[0].name: 'exact' is not a built-in reward"),
        ({"name": "math_exact", "function": "a:b"}, "exactly one of 'name'"),
        ({"name": "regex", "params": {}}, "rewards[0].params.pattern"),
        ({"name": "regex", "params": {"pattern": "("}}, "rewards[0].params.pattern: not a valid"),
        ({"name": "length_penalty", "params": {"max": 5, "target": 5}}, "exactly one of"),
        ({"name": "math_exact", "wieght": 2}, "rewards[0].wieght: unknown field"),
    ],
)
def test_bad_specs_are_one_line_config_errors_naming_the_field(spec, message):
    with pytest.raises(ConfigError) as e:
        RewardSet.from_specs([{"name": "math_exact"}, spec][1:])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_reward_returning_nan_is_a_failure():
    rewards = RewardSet({"nan": lambda p, c, r: float("nan")}, {"nan": 1.0})
    result = rewards.score_one(P, "x", {})
    assert result.total == 0.0 and result.failures == {"nan": "ValueError: reward is nan"}
