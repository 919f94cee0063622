"""Run lm-evaluation-harness against a served endpoint and read back one score per task.

The harness talks to the endpoint through its own OpenAI clients: `local-completions`
(log-likelihood via `echo` + `logprobs`, and generation) or `local-chat-completions` (generation
through the model's chat template). For log-likelihood tasks it needs the model's tokenizer to
split context from continuation; it reads it from the exported Hugging Face folder, and sends the
endpoint token ids, so both sides score exactly the same tokens. Nothing is downloaded: the Hub
is switched off in the child's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kiln.evaluate.task_files import TaskFile
from kiln.platform.errors import InputError, KilnError
from kiln.platform.extras import require_extra

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# The score reported per task, in order of preference (the first one the task has).
HEADLINE_METRICS = ("acc", "exact_match", "acc_norm", "word_perplexity")


class EvalError(KilnError):
    """lm-eval failed; the message names its log file."""


# lm-eval itself, and transformers for its tokenizer on log-likelihood tasks (the `eval` extra)
HARNESS_MODULES = ("lm_eval", "transformers")


def require_harness(what: str) -> None:
    """One line naming the `eval` extra when lm-eval cannot run here (before any work starts)."""
    require_extra("eval", HARNESS_MODULES, f"{what} (lm-evaluation-harness)")


@dataclass
class HarnessRun:
    """What to evaluate and where: an OpenAI-compatible base URL plus lm-eval options."""

    url: str  # the endpoint's base URL (without /v1)
    model_name: str
    tasks: list[TaskFile]
    include_path: Path
    api: Literal["completions", "chat"] = "completions"
    tokenizer_dir: str | None = None
    max_length: int = 2048
    num_concurrent: int = 4
    batch_size: int = 1
    limit: int | None = None
    num_fewshot: int | None = None
    api_key: str | None = None
    timeout_s: int = 300
    extra_model_args: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        ll = [t.name for t in self.tasks if t.loglikelihood]
        if ll and self.api == "chat":
            raise InputError(
                f"evaluate.api: chat completions cannot score log-likelihood tasks ({ll[0]}); "
                "use api: completions"
            )
        if ll and not self.tokenizer_dir:
            raise InputError(
                f"evaluate: log-likelihood task {ll[0]} needs the model's tokenizer: give a model "
                "(an ExportedModel / Hugging Face folder) beside the endpoint"
            )

    def model_args(self) -> dict[str, Any]:
        common = {
            "model": self.model_name,
            "num_concurrent": self.num_concurrent,
            "max_retries": 1,
            "timeout": self.timeout_s,
            "max_length": self.max_length,
        }
        if self.api == "chat":
            return {
                **common,
                "base_url": f"{self.url}/v1/chat/completions",
                "tokenizer_backend": None,
                **self.extra_model_args,
            }
        tok: dict[str, Any] = (
            {"tokenizer_backend": "huggingface", "tokenizer": self.tokenizer_dir}
            if self.tokenizer_dir
            else {"tokenizer_backend": None}
        )
        return {
            **common,
            **tok,
            "base_url": f"{self.url}/v1/completions",
            "tokenized_requests": bool(self.tokenizer_dir),
            "batch_size": self.batch_size,
            **self.extra_model_args,
        }


def check_endpoint(url: str, api_key: str | None) -> str:
    """The model name the endpoint serves; a one-line InputError if it cannot be reached."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{url}/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise InputError(f"evaluate.url: cannot reach {url} ({type(e).__name__}: {e})") from None
    if r.status_code != 200:
        raise InputError(f"evaluate.url: {url}/v1/models answered HTTP {r.status_code}")
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError):
        raise InputError(f"evaluate.url: {url} is not an OpenAI-compatible endpoint") from None


def run_harness(run: HarnessRun, out_dir: Path, log_path: Path) -> dict[str, Any]:
    """Run lm-eval in a child process (its output to `log_path`); returns its results JSON."""
    run.check()
    out_dir.mkdir(parents=True, exist_ok=True)
    request = {
        "model": "local-chat-completions" if run.api == "chat" else "local-completions",
        "model_args": run.model_args(),
        "tasks": [t.name for t in run.tasks],
        "include_path": str(run.include_path),
        "limit": run.limit,
        "num_fewshot": run.num_fewshot,
        "apply_chat_template": run.api == "chat",
        "output": str(out_dir / "lm_eval_results.json"),
        "samples_output": str(out_dir / "lm_eval_samples.jsonl"),
    }
    request_path = out_dir / "lm_eval_request.json"
    request_path.write_text(json.dumps(request, indent=2))
    env = {**os.environ, **OFFLINE_ENV, "OPENAI_API_KEY": run.api_key or ""}
    cache = out_dir / ".datasets-cache"  # datasets' Arrow copies of the task data: dropped after
    env.setdefault("HF_DATASETS_CACHE", str(cache))
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.run(
                [sys.executable, "-m", "kiln.evaluate.harness_main", str(request_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                check=False,
            )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if proc.returncode != 0:
        raise EvalError(f"lm-eval failed: {_last_error(log_path)} (log: {log_path})")
    return json.loads(Path(request["output"]).read_text(encoding="utf-8"))


def _last_error(log_path: Path) -> str:
    """The last line of the child's traceback (the exception), or its last line."""
    lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit")) and " " not in head:
            return line[:300]
    return lines[-1][:300] if lines else f"exit status, no output in {log_path}"


def task_scores(results: dict[str, Any], tasks: list[TaskFile]) -> dict[str, dict[str, Any]]:
    """Per task: every metric lm-eval reported (`acc`, `acc_stderr`, ...; filter names dropped),
    the sample count, and `score` / `metric`: the headline metric."""
    scores: dict[str, dict[str, Any]] = {}
    for t in tasks:
        raw = results["results"].get(t.name, {})
        metrics = {
            key.split(",", 1)[0]: value
            for key, value in raw.items()
            if "," in key and isinstance(value, (int, float))
        }
        headline = next((m for m in HEADLINE_METRICS if m in metrics), None)
        scores[t.name] = {
            **metrics,
            "metric": headline,
            "score": metrics.get(headline) if headline else None,
            "samples": results.get("n_samples", {}).get(t.name, {}).get("effective"),
            "output_type": t.output_type,
        }
    return scores
