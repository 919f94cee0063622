"""lm-evaluation-harness end to end against `kiln serve`: a log-likelihood task and a generation
task score what the model itself says they should, a second run (the `evaluate` stage in a
pipeline, after a serve stage's Endpoint) gives the same numbers, and chat completions work too.
The stage starting its own endpoint for a model is the same `launch` the serve stage uses; it is
run by `kiln eval MODEL_DIR` and kiln/pipelines/evaluate_smollm2.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kiln.evaluate import EvaluateConfig, evaluate
from kiln.platform.artifact import Artifact
from tests.conftest import free_port
from tests.serving.rest.tiny_model import make_tiny_model

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MC_ITEMS = [
    ("the quick brown", ["fox", "dog", "kiln"], 0),
    ("hello world, this is", ["a tiny", "the lazy", "ray serve"], 1),
    ("kiln turns raw text", ["into a", "over http", "jumps"], 2),
    ("triton and ray serve", ["answer requests", "the fox", "tokenizer"], 0),
    ("over the lazy", ["dog", "model", "grpc"], 1),
    ("a served language", ["model", "fox", "world"], 2),
]
GEN_PROMPTS = ["the quick", "hello world", "kiln turns", "triton and", "ray serve", "a tiny"]
GEN_KWARGS = {"until": ["\n"], "max_gen_toks": 12, "do_sample": False, "temperature": 0}


def _task_yaml(path: Path, name: str, output_type: str, extra: dict) -> str:
    import yaml

    body = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": f"{name}.jsonl"}},  # relative to the YAML
        "test_split": "test",
        "output_type": output_type,
        "doc_to_text": "{{question}}",
        **extra,
    }
    (path / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return str(path / f"{name}.yaml")


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _gen_task(tmp: Path, name: str, answers: list[str]) -> str:
    """Half the targets are the model's own answers, half are wrong: exact match must be 0.5."""
    rows = [
        {"question": p, "answer": a.strip() if i % 2 == 0 else "not the answer"}
        for i, (p, a) in enumerate(zip(GEN_PROMPTS, answers, strict=True))
    ]
    assert all(r["answer"] for r in rows), "a prompt whose greedy answer is blank"
    _jsonl(tmp / f"{name}.jsonl", rows)
    return _task_yaml(
        tmp,
        name,
        "generate_until",
        {
            "doc_to_target": "answer",
            "generation_kwargs": GEN_KWARGS,
            "filter_list": [{"name": "strip", "filter": [{"function": "remove_whitespace"}]}],
            "metric_list": [
                {"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}
            ],
        },
    )


def _expected_mc_accuracy(gen) -> float:
    """Argmax over choices of the summed log-probability, with the model called directly and the
    context/continuation split lm-eval uses (encode the whole, cut at the context's length)."""
    right = 0
    for question, choices, gold in MC_ITEMS:
        scores = []
        for choice in choices:
            whole, ctx = gen.encode(f"{question} {choice}"), gen.encode(question)
            with torch.no_grad():
                logp = torch.log_softmax(gen.model(torch.tensor([whole]))[0].float(), -1)
            scores.append(sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole))))
        right += int(np.argmax(scores) == gold)
    return right / len(MC_ITEMS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    out = make_tiny_model(str(tmp_path_factory.mktemp("eval") / "model"))
    cfg_path = Path(out) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "chat_template": CHAT_TEMPLATE}))
    Artifact(uri=out, kind="ExportedModel", fingerprint="tiny-eval").commit()
    return out


@pytest.fixture(scope="module")
def endpoint(ray_session, model_dir):
    from kiln.serving.launch import launch

    ep = launch(
        model_dir,
        {"deployment": {"num_cpus": 0.5}},
        port=free_port(),
        app_name="eval-test",
        route_prefix="/eval-test",
    )
    yield ep
    ep.close()
    from ray import serve

    serve.shutdown()  # its controller and proxy idle at ~0.04 cores for the rest of the run


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, model_dir) -> dict:
    from kiln.engine.generator import Generator
    from kiln.engine.sampler import SamplingParams

    gen = Generator.load(model_dir)
    tmp = tmp_path_factory.mktemp("tasks")
    rows = [{"question": q, "choices": c, "gold": g} for q, c, g in MC_ITEMS]
    _jsonl(tmp / "t_mc.jsonl", rows)
    mc = _task_yaml(
        tmp,
        "t_mc",
        "multiple_choice",
        {
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "gold",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        },
    )
    params = SamplingParams(max_new_tokens=GEN_KWARGS["max_gen_toks"], stop=["\n"])
    answers = [c.text for c in gen.generate(GEN_PROMPTS, params)]
    return {"files": [mc, _gen_task(tmp, "t_gen", answers)], "mc": _expected_mc_accuracy(gen)}


@pytest.mark.slow
def test_lm_eval_scores_the_endpoint_and_a_rerun_agrees(endpoint, model_dir, tasks, tmp_path):
    from kiln.platform.pipeline import Pipeline
    from kiln.platform.registry import stage_class
    from kiln.platform.runtime import Runtime

    cfg = EvaluateConfig(tasks=[*tasks["files"], "kiln_mc_en", "kiln_mc_ja", "kiln_qa_gen"])
    first = evaluate(cfg, tmp_path / "first", url=endpoint.url, model_dir=model_dir)
    scores = {name: s["score"] for name, s in first["tasks"].items()}
    assert scores["t_mc"] == pytest.approx(tasks["mc"])
    assert scores["t_gen"] == pytest.approx(0.5)
    assert {n: first["tasks"][n]["samples"] for n in first["tasks"]} == {
        "t_mc": 6,
        "t_gen": 6,
        "kiln_mc_en": 24,
        "kiln_mc_ja": 20,
        "kiln_qa_gen": 20,
    }
    assert (tmp_path / "first" / "lm_eval.log").stat().st_size > 0
    # the second run: the evaluate stage in a pipeline, after a serve stage's Endpoint artifact;
    # our two tasks (one per request kind) suffice there, the shipped ones were scored above
    served = Artifact(uri=str(tmp_path / "endpoint"), kind="Endpoint", meta=endpoint.meta)
    served.commit()
    Evaluate = stage_class("evaluate")
    rerun = EvaluateConfig(tasks=tasks["files"])
    pipeline = Pipeline(
        "evaltest",
        [Evaluate(rerun, inputs={"endpoint": served.uri, "model": model_dir})],
        runs_dir=tmp_path / "runs",
    )
    result = pipeline.run(runtime=Runtime(), shutdown=False)
    out = Path(result.outputs["evaluate.metrics"].path)
    second = json.loads((out / "metrics.json").read_text())
    assert set(second["tasks"]) == {"t_mc", "t_gen"}
    # every metric of both tasks, to the last digit
    assert second["tasks"] == {n: first["tasks"][n] for n in second["tasks"]}
    run_metrics = result.record["stages"]["evaluate"]["metrics"]
    assert run_metrics["t_mc/acc"] == scores["t_mc"]
    assert "| t_gen | generate_until | exact_match | 0.5000 |" in (out / "report.md").read_text()


@pytest.mark.slow
def test_lm_eval_chat_completions_generation(endpoint, model_dir, tmp_path):
    """local-chat-completions through the model's chat template: the targets that are the
    endpoint's own chat answers (asked with the openai client) match, the others do not."""
    from openai import OpenAI

    client = OpenAI(base_url=endpoint.url + "/v1", api_key="none")
    answers = [
        client.chat.completions.create(
            model=endpoint.model_name,
            messages=[{"role": "user", "content": p}],
            max_tokens=GEN_KWARGS["max_gen_toks"],
            temperature=0,
            stop=["\n"],
        )
        .choices[0]
        .message.content
        for p in GEN_PROMPTS
    ]
    task = _gen_task(tmp_path, "t_chat", answers)
    cfg = EvaluateConfig(tasks=[task], api="chat")
    result = evaluate(cfg, tmp_path / "out", url=endpoint.url)
    assert result["tasks"]["t_chat"]["score"] == pytest.approx(0.5)
    assert result["api"] == "chat"
