"""Layout and device mistakes fail `kiln run` in one line, exit 2, before any Ray starts; an error
raised inside a Ray Train worker reaches the user as one line, its traceback in the run log."""

from __future__ import annotations

import time

import pytest

import kiln.training.preflight  # noqa: F401 - imported here: the timing below is the check's own
import kiln.training.stages  # noqa: F401
from kiln.platform import console
from kiln.platform.cli import main
from kiln.platform.errors import ConfigError, StageFailed
from kiln.training.worker_errors import worker_error

SPEC = """\
pipeline: layout
ray: {num_cpus: 2, num_gpus: 0}
stages:
  - stage: train
    config:
      model: {preset: tiny}
      seq_len: 64
      global_batch_size: 24
      micro_batch_size: 4
      steps: 2
      data: {synthetic: true}
"""


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.parallel.tp=3", "train.parallel.tp=3 must divide model.n_heads (4)"),
        ("train.device=cuda", "train.device=cuda but this machine has 0 GPU(s) for 1 worker(s)"),
        (  # 6 workers x 0.5 CPU on 2 CPUs: Ray Train would wait for them forever
            "train.parallel.dp_shard=6",
            "train.parallel: 6 training workers need 3 CPUs (0.5 each), this machine has 2",
        ),
        ("train.parallel.pp=8", "model.n_layers (4) must be >= the number of pipeline stages (8)"),
        ("train.parallel.cp=3", "seq_len=64 must be a multiple of 2*parallel.cp = 6"),
    ],
    ids=["tp-heads", "cuda-without-gpu", "more-workers-than-cpus", "pp-layers", "cp-seq"],
)
def test_layout_mistake_is_one_line_before_ray(tmp_path, capsys, monkeypatch, override, expected):
    import ray

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "spec.yaml").write_text(SPEC)
    t0 = time.perf_counter()
    code = main(["run", "spec.yaml", "--runs-dir", "runs", "--set", override])
    took_s = time.perf_counter() - t0
    lines = capsys.readouterr().err.splitlines()
    assert code == 2, lines
    assert lines == [f"kiln: error: {lines[0].removeprefix('kiln: error: ')}"], lines
    assert expected in lines[0], lines
    assert took_s < 2.0, took_s  # a Ray start alone takes 3.5-5.5 s here; today's run ~20 s
    assert not ray.is_initialized()
    assert not (tmp_path / "runs").exists()  # refused before the run began


def _worker_group_error(raised: Exception):
    """What Ray Train's `fit` raises when rank 0 raised `raised` (built from its own classes)."""
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    tb = f'Traceback (most recent call last):\n  File "trainer.py", line 1\n{raised!r}\n'
    failure = UserExceptionWithTraceback(raised, traceback_str=tb)
    return WorkerGroupError(f"[Rank 0 Error Snippet]:\n{tb}", {0: failure})


def test_a_kiln_error_on_a_worker_is_re_raised_as_itself(tmp_path):
    raised = ConfigError("parallel.tp=3 must divide model.n_heads (4) and n_kv_heads (2)")
    err = worker_error(_worker_group_error(raised), str(tmp_path))
    assert type(err) is ConfigError and str(err) == str(raised)


@pytest.mark.parametrize("run_log", [True, False], ids=["run-log", "no-run-log"])
def test_another_worker_error_is_one_line_pointing_at_its_traceback(tmp_path, run_log):
    group_error = _worker_group_error(RuntimeError("boom\nsecond line"))
    handler = console.attach_run_log(tmp_path) if run_log else None
    try:
        err = worker_error(group_error, str(tmp_path / "train"))
    finally:
        if handler is not None:
            console.detach_run_log(handler)
    assert isinstance(err, StageFailed)
    message = str(err)
    assert "\n" not in message
    assert message.startswith("training failed on rank 0: RuntimeError: boom (see "), message
    where = message.rsplit("(see ", 1)[1].rstrip(")")
    expected = (
        tmp_path / "logs" / "kiln.log" if run_log else tmp_path / "train" / "worker-error.txt"
    )
    assert where == str(expected)
    assert "Traceback (most recent call last)" in expected.read_text()


SFT_SPEC = """\
pipeline: sft-layout
stages:
  - stage: tests.platform.stages_for_tests:CountRuns
    name: before
    config: {log: log.txt}
  - stage: sft
    config: {model: {preset: tiny}, seq_len: 64, steps: 2, data: {paths: [no/such/chat]}}
"""


@pytest.mark.parametrize(
    "override, expected",
    [
        ("sft.parallel.tp=2", "(without `ray:` it trains one rank in this process)"),
        ("sft.device=cuda", "sft.device=cuda but this machine has 0 GPU(s)"),
    ],
    ids=["in-process-layout", "cuda-without-gpu"],
)
def test_a_late_post_training_stage_fails_the_run_before_the_first(
    tmp_path, capsys, monkeypatch, override, expected
):
    import torch

    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(SFT_SPEC)
    assert main(["run", "spec.yaml", "--runs-dir", "runs", "--set", override]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kiln: error: sft.") and expected in line, line
    assert not (tmp_path / "log.txt").exists()  # the first stage never ran


def test_a_controller_error_names_the_controller(tmp_path):
    from ray.train import ControllerError

    err = worker_error(ControllerError(RuntimeError("placement group removed")), str(tmp_path))
    assert str(err).startswith(
        "training failed on Ray Train's controller: RuntimeError: placement group removed (see "
    ), err
