"""RL prompt sets: JSONL and Parquet rows, one-line errors, rendering as transformers does."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.platform.errors import InputError
from kiln.text.chat_template import CHATML, ChatTemplate
from kiln.training.rl.prompts import load_prompts, render_prompt
from tests.training.post.helpers import LLAMA2_STYLE, chat_tokenizer, save_hf_tokenizer

ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "5"},
    {
        "messages": [
            {"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": "What is 7 * 6?"},
        ],
        "answer": 42,
    },
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_and_parquet_give_the_same_rows_with_their_reward_fields(tmp_path):
    jsonl = load_prompts(_jsonl(tmp_path / "p.jsonl", ROWS))
    assert jsonl == ROWS
    flat = [{"prompt": f"q{i}", "answer": str(i), "tests": f"assert f({i})"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "p.parquet")
    assert load_prompts(str(tmp_path / "p.parquet")) == flat


@pytest.mark.parametrize(
    "bad, reason",
    [
        ({"answer": 1}, "expected a 'prompt'"),
        ({"prompt": "  "}, "'prompt' must be a non-empty string"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role 'robot'"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "must end on a user",
        ),
    ],
)
def test_a_bad_row_is_a_one_line_error_naming_file_and_line(tmp_path, bad, reason):
    path = _jsonl(tmp_path / "p.jsonl", [ROWS[0], ROWS[1], bad])
    with pytest.raises(InputError) as e:
        load_prompts(path)
    assert str(e.value).startswith(f"{path}:3: ")
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_invalid_json_names_its_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(InputError, match=r"p\.jsonl:2: invalid JSON"):
        load_prompts(str(path))


@pytest.mark.parametrize("source", ["chatml", LLAMA2_STYLE])
def test_rendering_equals_transformers_apply_chat_template(source, tmp_path):
    from transformers import AutoTokenizer

    path = save_hf_tokenizer(
        chat_tokenizer(), str(tmp_path / "tok"), CHATML if source == "chatml" else source
    )
    hf = AutoTokenizer.from_pretrained(path)
    template = ChatTemplate.from_pretrained(path)
    for row in ROWS:
        messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render_prompt(row, template) == expected


def test_plain_prompt_is_verbatim_without_a_template_or_in_raw_format():
    template = ChatTemplate.builtin("chatml")
    assert render_prompt(ROWS[0], None) == "What is 2 + 3?"
    assert render_prompt(ROWS[0], template, prompt_format="raw") == "What is 2 + 3?"
    assert render_prompt(ROWS[0], template).startswith("<|im_start|>user\nWhat is 2 + 3?")
    with pytest.raises(InputError, match="no chat template"):
        render_prompt(ROWS[1], None)
