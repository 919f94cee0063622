"""What a user gets wrong is one line naming it, before any endpoint is started."""

from __future__ import annotations

import pytest

from kiln.evaluate import EvaluateConfig, evaluate
from kiln.platform.errors import InputError
from tests.conftest import free_port


def test_unreachable_endpoint_is_a_one_line_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    cfg = EvaluateConfig(tasks=["kiln_qa_gen"])
    with pytest.raises(InputError, match=rf"evaluate\.url: cannot reach {url} \(Connect") as e:
        evaluate(cfg, tmp_path, url=url)
    assert "\n" not in str(e.value)


def test_log_likelihood_tasks_need_completions_and_a_tokenizer(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # never reached: the checks come first
    with pytest.raises(InputError, match="chat completions cannot score log-likelihood"):
        evaluate(EvaluateConfig(tasks=["kiln_mc_en"], api="chat"), tmp_path, url=url)
    with pytest.raises(InputError, match="kiln_mc_ja needs the model's tokenizer"):
        evaluate(EvaluateConfig(tasks=["kiln_mc_ja"]), tmp_path, url=url)


def test_nothing_to_evaluate_against(tmp_path):
    with pytest.raises(InputError, match="give an endpoint .* or a model"):
        evaluate(EvaluateConfig(tasks=["kiln_qa_gen"]), tmp_path)
    with pytest.raises(InputError, match="no tasks and no TokenDataset"):
        evaluate(EvaluateConfig(tasks=[]), tmp_path, url="http://127.0.0.1:1")
    with pytest.raises(InputError, match="perplexity: needs a model"):
        evaluate(EvaluateConfig(tasks=[]), tmp_path, tokens_dir=str(tmp_path))


def test_bad_task_file_fails_before_the_endpoint_is_contacted(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: x\ndataset_path: json\n")
    with pytest.raises(InputError, match="bad.yaml: dataset_path 'json' needs data_files"):
        evaluate(EvaluateConfig(tasks=[str(bad)]), tmp_path, url="http://127.0.0.1:1")


@pytest.mark.slow
def test_lm_eval_failing_is_one_line_naming_its_log(tmp_path):
    """The endpoint goes away after the check: lm-eval's own exception, one line, and the log."""
    from kiln.evaluate.harness import EvalError, HarnessRun, run_harness
    from kiln.evaluate.task_files import prepare_tasks

    tasks = prepare_tasks(["kiln_qa_gen"], tmp_path / "tasks")
    run = HarnessRun(
        url=f"http://127.0.0.1:{free_port()}",
        model_name="gone",
        tasks=tasks,
        include_path=tmp_path / "tasks",
        limit=1,
    )
    with pytest.raises(
        EvalError, match=r"lm-eval failed: .*Cannot connect .*\(log: .*lm_eval\.log\)"
    ):
        run_harness(run, tmp_path, tmp_path / "lm_eval.log")


def test_kiln_eval_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    from kiln.platform.cli import main

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["eval", "--url", url, "--tasks", "kiln_qa_gen", "--out", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kiln: error: evaluate.url: cannot reach {url} (ConnectError")
    assert main(["eval", "--url", url, "--tasks", "kiln_mc_en", "--api", "chat"]) == 2
    assert "chat completions cannot score" in capsys.readouterr().err
