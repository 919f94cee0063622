"""The `generate` stage on one in-process engine over a tiny random model: rows out with their
generation, token counts and finish reason; per-row failures recorded; batch-level resume; the
stage in a pipeline spec and `kiln generate-batch`."""

from __future__ import annotations

import glob
import json
import os

import pyarrow.parquet as pq
import pytest

from kiln.curator.generate.config import GenerateConfig, JudgeConfig
from kiln.curator.generate.run import generate
from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.platform.cli import main
from kiln.platform.spec import load_pipeline
from kiln.text.chat_template import ChatTemplate
from tests.serving.rest.tiny_model import make_tiny_model

TOPICS = ["fox", "kiln", "ray", "dog", "tiny", "world", "hello"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_model(str(tmp_path_factory.mktemp("gen") / "model"), max_seq_len=256)


def _rows(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(tiny: str, path: str, **fields) -> GenerateConfig:
    base = {
        "input": [path],
        "model": tiny,
        "prompt": "the {{ topic }}",
        "stream": "inline",
        "batch_rows": 2,
        "sampling": {"max_new_tokens": 6},
    }
    return GenerateConfig(**{**base, **fields})


def _table(folder: str):
    return pq.read_table(sorted(glob.glob(f"{folder}/shard-*.parquet"))[0]).to_pylist()


def test_rows_out_hold_the_engines_greedy_text_and_token_counts(tiny, tmp_path):
    path = _rows(tmp_path, [{"topic": t, "text": f"doc {t}"} for t in TOPICS])
    report = generate(_cfg(tiny, path, n=2), str(tmp_path / "out"))
    rows = _table(str(tmp_path / "out"))
    assert [r["id"] for r in rows[:2]] == ["rows.jsonl:0/0", "rows.jsonl:0/1"]
    assert len(rows) == 2 * len(TOPICS) == report["kept"] and report["invariant_holds"]
    gen = Generator.load(tiny)
    direct = gen.generate([f"the {t}" for t in TOPICS], SamplingParams(max_new_tokens=6))
    for row in rows:
        want = direct[TOPICS.index(row["topic"])]
        assert row["text"] == want.text and row["input_text"] == f"doc {row['topic']}"
        assert row["prompt_tokens"] == want.prompt_tokens
        assert row["completion_tokens"] == want.completion_tokens
        assert row["finish_reason"] == want.finish_reason and row["source"] == "generate"
    assert report["completion_tokens"] == sum(r["completion_tokens"] for r in rows)
    assert report["tokens_per_s"] > 0 and report["rows_per_s"] > 0
    assert report["batches"] == {"total": 4, "resumed": 0, "processed": 4}
    assert not os.path.exists(tmp_path / "out" / "_work")


def test_a_row_that_cannot_run_is_a_recorded_failure_and_the_rest_are_done(tiny, tmp_path):
    rows = [{"topic": "fox"}, {"topic": "fox " * 300}, {"name": "no topic"}, {"topic": "dog"}]
    report = generate(_cfg(tiny, _rows(tmp_path, rows)), str(tmp_path / "out"))
    assert [r["topic"] for r in _table(str(tmp_path / "out"))] == ["fox", "dog"]
    failed = pq.read_table(tmp_path / "out" / "rejected" / "part-00000.parquet").to_pylist()
    assert [(r["id"], r["reason"]) for r in failed] == [
        ("rows.jsonl:1", "prompt_too_long"),
        ("rows.jsonl:2", "prompt_template"),
    ]
    assert "at most 255 fit" in failed[0]["error"] and "'topic' is undefined" in failed[1]["error"]
    assert report["removed_by_reason"] == {"prompt_too_long": 1, "prompt_template": 1}
    assert report["kept"] + report["rejected"] == 4


def test_chat_messages_are_rendered_with_the_chat_template(tiny, tmp_path):
    path = _rows(tmp_path, [{"topic": "fox"}])
    system = {"role": "system", "content": "Be brief."}
    messages = [system, {"role": "user", "content": "{{ topic }}?"}]
    cfg = _cfg(tiny, path, prompt=None, messages=messages, chat_template="chatml")
    generate(cfg, str(tmp_path / "out"))
    [row] = _table(str(tmp_path / "out"))
    want = ChatTemplate.builtin("chatml").render(
        [system, {"role": "user", "content": "fox?"}],
        add_generation_prompt=True,
    )
    assert row["prompt"] == want and row["prompt"].endswith("<|im_start|>assistant\n")


def test_a_judge_keeps_only_rows_whose_parsed_score_reaches_its_minimum(tiny, tmp_path):
    judge = JudgeConfig(pattern=r"score: (\d+)", min_score=4)
    assert [judge.score(t) for t in ["score: 5", "Score 5", "score: 3!"]] == [5.0, None, 3.0]
    with pytest.raises(ValueError, match="group"):
        JudgeConfig(pattern=r"\d", min_score=1)
    path = _rows(tmp_path, [{"topic": t} for t in TOPICS[:3]])
    report = generate(_cfg(tiny, path, judge=judge, output_field="judgement"), str(tmp_path / "o"))
    assert report["kept"] == 0 and report["removed_by_reason"] == {"judge_score": 3}


def test_a_rerun_generates_only_the_batches_not_recorded_and_writes_the_same_bytes(tiny, tmp_path):
    path = _rows(tmp_path, [{"topic": t} for t in TOPICS[:5]])
    cfg = _cfg(tiny, path, sampling={"max_new_tokens": 6, "temperature": 0.9, "seed": 3})
    work = str(tmp_path / "work")
    first = generate(cfg, str(tmp_path / "first"), work_dir=work)
    os.remove(os.path.join(work, "done", "00000001.json"))  # as if killed during batch 1
    again = generate(cfg, str(tmp_path / "again"), work_dir=work)
    assert again["batches"] == {"total": 3, "resumed": 2, "processed": 1}
    assert again["rows_processed"] == 2 and again["kept"] == first["kept"] == 5
    name = "shard-00000.parquet"
    assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "first" / name).read_bytes()
    other = generate(cfg.model_copy(update={"prompt": "a {{ topic }}"}), str(tmp_path / "x"), work)
    assert other["batches"]["resumed"] == 0  # another config: the work folder starts over


def test_the_stage_in_a_pipeline_spec_then_curate(tiny, tmp_path):
    path = _rows(tmp_path, [{"topic": t} for t in TOPICS])
    spec = tmp_path / "gen.yaml"
    spec.write_text(
        f"pipeline: gen\nruns_dir: {tmp_path / 'runs'}\nstages:\n"
        f"  - stage: generate\n    config: {{input: [{path}], model: {tiny}, "
        "prompt: 'the {{ topic }}', stream: inline, sampling: {max_new_tokens: 4}}\n"
        "  - stage: curate\n    config: {stream: inline}\n"
    )
    result = load_pipeline(str(spec)).run(shutdown=False)
    art = result.artifact("generate.corpus")
    assert art.kind == "Corpus" and art.counts == {"documents": len(TOPICS), "rejected": 0}
    curated = result.artifact("curate.corpus")
    assert curated.counts["input"] == len(TOPICS)


def test_cli_generates_and_a_bad_config_is_one_line(tiny, tmp_path, capsys):
    path = _rows(tmp_path, [{"topic": t} for t in TOPICS[:2]])
    out = str(tmp_path / "out")
    args = ["generate-batch", "--input", path, "--model", tiny, "--out", out]
    code = main([*args, "--prompt", "the {{ topic }}", "--stream", "inline"])
    assert code == 0 and len(_table(out)) == 2
    assert main([*args[:-1], str(tmp_path / "o2"), "--set", "n=0", "--prompt", "x"]) == 2
    assert "n" in capsys.readouterr().err.splitlines()[-1]
