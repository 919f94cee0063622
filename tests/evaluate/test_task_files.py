"""Task files: the shipped ones load as lm-eval reads them; a bad one is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.evaluate.task_files import load_task, prepare_tasks, shipped_tasks
from kiln.platform.errors import InputError


def test_shipped_tasks_load_with_absolute_data_files(tmp_path):
    assert shipped_tasks() == ["kiln_mc_en", "kiln_mc_ja", "kiln_qa_gen"]
    tasks = prepare_tasks(shipped_tasks(), tmp_path)
    kinds = {t.name: t.output_type for t in tasks}
    assert kinds == {
        "kiln_mc_en": "multiple_choice",
        "kiln_mc_ja": "multiple_choice",
        "kiln_qa_gen": "generate_until",
    }
    for t in tasks:
        (data,) = t.body["dataset_kwargs"]["data_files"].values()
        rows = [json.loads(line) for line in Path(data).read_text("utf-8").splitlines()]
        assert len(rows) >= 20 and (tmp_path / f"{t.name}.yaml").is_file()
        if t.loglikelihood:  # every gold index points into its choices
            assert all(0 <= r["gold"] < len(r["choices"]) for r in rows)


def _write(tmp_path, text: str, name: str = "task.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("task: [unclosed", r"task\.yaml: line 1 not valid YAML"),
        ("- just a list", "not an lm-eval task file"),
        (
            "task: t\ndataset_path: json\ndataset_kwargs: {data_files: {test: nope.jsonl}}",
            "data file nope.jsonl not found",
        ),
        ("task: t\ndataset_path: json", "needs data_files"),
        ("task: t\noutput_type: ranking", "output_type 'ranking'"),
        ("task: t\nprocess_docs: !function utils.process", "`!function` tags are not supported"),
    ],
)
def test_bad_task_file_is_a_one_line_error(tmp_path, text, message):
    with pytest.raises(InputError, match=message) as e:
        load_task(_write(tmp_path, text))
    assert "\n" not in str(e.value)


def test_unknown_task_name_lists_the_shipped_ones():
    with pytest.raises(InputError, match="neither a shipped task .*kiln_mc_en"):
        load_task("hellaswag")
