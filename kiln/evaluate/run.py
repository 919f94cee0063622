"""One evaluation: lm-eval tasks against an endpoint (a given URL, or one started for the model)
plus held-out perplexity; writes metrics.json, report.md and lm-eval's log into `out_dir`.
Shared by the `evaluate` stage and `kiln eval`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kiln.evaluate.config import EvaluateConfig
from kiln.evaluate.harness import (
    HarnessRun,
    check_endpoint,
    require_harness,
    run_harness,
    task_scores,
)
from kiln.evaluate.perplexity import dataset_perplexity
from kiln.evaluate.report import console_lines, flat_metrics, write_report
from kiln.evaluate.task_files import prepare_tasks
from kiln.model.formats.hf import find_hf_dir
from kiln.platform.errors import InputError
from kiln.platform.registry import component

log = logging.getLogger("kiln")
EVAL_APP = "kiln-eval"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hf_dir(model_dir: str | None) -> str | None:
    if model_dir is None:
        return None
    return find_hf_dir(model_dir)


def _context_length(hf_dir: str | None) -> int:
    if hf_dir is None:
        return 2048
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    return int(cfg.get("max_position_embeddings") or 2048)


@contextlib.contextmanager
def _endpoint(
    cfg: EvaluateConfig, url: str | None, model_dir: str | None, ensure_ray: Callable[[], Any]
) -> Iterator[str]:
    """The base URL to evaluate: the one given, or an endpoint started for `model_dir`."""
    if url:
        yield url.rstrip("/")
        return
    if model_dir is None:
        raise InputError("evaluate: give an endpoint (url or an Endpoint input) or a model")
    launch = component("endpoint.launch")  # serving's, given by the composition root
    ensure_ray()
    settings = {
        "batching": cfg.batching.model_dump(),
        "deployment": {"num_cpus": cfg.num_cpus},
    }
    endpoint = launch(
        model_dir, settings, port=_free_port(), app_name=EVAL_APP, route_prefix=f"/{EVAL_APP}"
    )
    try:
        yield endpoint.url
    finally:
        endpoint.close()


def evaluate(
    cfg: EvaluateConfig,
    out_dir: Path,
    *,
    url: str | None = None,
    model_dir: str | None = None,
    tokens_dir: str | None = None,
    api_key: str | None = None,
    ensure_ray: Callable[[], Any] = lambda: None,
) -> dict[str, Any]:
    """Run the configured tasks and perplexity; returns metrics.json's content."""
    if cfg.tasks:
        require_harness("evaluate.tasks")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = _hf_dir(model_dir)
    if not cfg.tasks and not (cfg.perplexity is not None and tokens_dir):
        raise InputError("evaluate: no tasks and no TokenDataset for perplexity: nothing to do")
    if cfg.perplexity is not None and tokens_dir and model_dir is None:
        raise InputError("evaluate.perplexity: needs a model (an ExportedModel) beside the tokens")
    result: dict[str, Any] = {"tasks": {}, "perplexity": None, "lm_eval_version": None}
    if cfg.tasks:
        tasks = prepare_tasks(cfg.tasks, out_dir / "tasks")
        run = HarnessRun(
            url="",
            model_name="",
            tasks=tasks,
            include_path=out_dir / "tasks",
            api=cfg.api,
            tokenizer_dir=hf_dir,
            max_length=cfg.max_length or _context_length(hf_dir),
            num_concurrent=cfg.num_concurrent,
            limit=cfg.limit,
            num_fewshot=cfg.num_fewshot,
            api_key=api_key,
            timeout_s=cfg.timeout_s,
        )
        run.check()  # before an endpoint is started for nothing
        with _endpoint(cfg, url, model_dir, ensure_ray) as base_url:
            run.url = base_url
            run.model_name = check_endpoint(base_url, api_key)
            log.info("evaluate: lm-eval on %s (%s), log in %s", base_url, cfg.api, out_dir)
            raw = run_harness(run, out_dir, out_dir / "lm_eval.log")
        result.update(
            endpoint=base_url,
            api=cfg.api,
            lm_eval_version=raw["lm_eval_version"],
            tasks=task_scores(raw, tasks),
        )
    if cfg.perplexity is not None and tokens_dir:
        p = cfg.perplexity
        result["perplexity"] = dataset_perplexity(
            model_dir,  # type: ignore[arg-type]  (checked above)
            tokens_dir,
            split=p.split,
            seq_len=p.seq_len,
            batch_size=p.batch_size,
            max_tokens=p.max_tokens,
        ).as_dict()
    (out_dir / "metrics.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    write_report(result, out_dir / "report.md")
    for line in console_lines(result):
        print(line, flush=True)
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The stage's metrics for run.json: one number per task and the perplexity."""
    return flat_metrics(result)


def api_key_from_env(var: str | None) -> str | None:
    if not var:
        return None
    key = os.environ.get(var)
    if not key:
        raise InputError(f"evaluate.api_key_env: environment variable {var} is not set")
    return key
