"""The quiet console: the terminal gets stage lines and progress, the run log gets everything
(library INFO, Python warnings), and progress of a job elsewhere is read from its metrics JSONL
(off a terminal into the run log only)."""

from __future__ import annotations

import json
import logging
import time
import warnings

import pytest

from kiln.platform import console


@pytest.fixture
def quiet(capsys):
    console.configure(verbose=False)
    yield
    logging.captureWarnings(False)
    console.configure(verbose=False)


def test_terminal_shows_stage_lines_and_the_run_log_keeps_the_rest(quiet, capsys, tmp_path):
    handler = console.attach_run_log(tmp_path)
    serve = logging.getLogger("ray.serve")  # as serve.run leaves it: its own terminal handler
    serve.handlers.clear()
    serve.addHandler(logging.StreamHandler())
    serve.propagate = False
    console.route_library_loggers()
    data = logging.getLogger("ray.data")  # as Ray Data configures it on import
    data.handlers.clear()
    data.addHandler(logging.StreamHandler())
    data.propagate = False
    console.route_library_loggers()
    serve.info("Application 'kiln' is ready")
    logging.getLogger("ray.data._internal.execution").info("Execution plan of Dataset ...")
    logging.getLogger("kiln").info("stage sft: started")
    logging.getLogger("kiln.checkpoint").info("checkpoint step 2 committed")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        logging.captureWarnings(False)  # an earlier test may have left it on (then True is a no-op
        logging.captureWarnings(True)  # and pytest's own recorder would take the warning)
        warnings.warn("torch.distributed is disabled", UserWarning, stacklevel=1)
    logging.getLogger("ray.serve").error("replica died")
    console.detach_run_log(handler)
    terminal = capsys.readouterr().err
    assert "stage sft: started" in terminal and "replica died" in terminal
    assert "checkpoint step" not in terminal and "Execution plan" not in terminal
    assert "is ready" not in terminal
    assert "Warning" not in terminal
    saved = (tmp_path / "logs" / "kiln.log").read_text()
    for line in ("started", "step 2", "Execution plan", "UserWarning", "is ready"):
        assert line in saved, line


def test_a_root_handler_on_a_library_logger_keeps_every_record(quiet, tmp_path):
    """A root handler that is on the `ray` logger as well (pytest's capture handlers were, in a
    test worker) is not filtered: caplog lost every record below ERROR for the rest of that
    worker after a test ran a pipeline in-process."""
    seen: list[str] = []
    shared = logging.Handler()
    shared.emit = lambda record: seen.append(record.getMessage())
    ray_log = logging.getLogger("ray")
    logging.getLogger().addHandler(shared)
    ray_log.addHandler(shared)
    try:
        console.route_library_loggers()
        logging.getLogger("kiln.triton").warning("restarting tritonserver")
    finally:
        ray_log.removeHandler(shared)
        logging.getLogger().removeHandler(shared)
    assert seen == ["restarting tritonserver"]
    assert shared.filters == []


def test_follow_metrics_reads_the_steps_into_the_run_log_off_a_terminal(quiet, capsys, tmp_path):
    path = tmp_path / "metrics.jsonl"
    handler = console.attach_run_log(tmp_path)
    try:
        with console.follow_metrics(str(path), 4, "pretrain") as follow:
            follow.progress.every_s = 0.0
            with open(path, "w") as f:
                for step in (1, 2, 3):
                    f.write(json.dumps({"step": step, "loss": 5.0 - step}) + "\n")
            for _ in range(50):
                if follow.progress.done == 3:
                    break
                time.sleep(0.1)
            with open(path, "a") as f:  # the last step lands just before the job ends
                f.write(json.dumps({"step": 4, "loss": 1.0}) + "\n")
                f.write('{"step": 5, "lo')  # a line being written is not read
    finally:
        console.detach_run_log(handler)
    assert "pretrain:" not in capsys.readouterr().err  # a pipe or CI log: stage lines only
    lines = [
        ln for ln in (tmp_path / "logs" / "kiln.log").read_text().splitlines() if "pretrain:" in ln
    ]
    assert lines and "4/4 steps (loss 1.000)" in lines[-1], lines
