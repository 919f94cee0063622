"""lm-evaluation-harness task files: the ones Kiln ships and the ones a user names.

A task is named either by a shipped task's name (`kiln_mc_en`, `kiln_mc_ja`, `kiln_qa_gen`) or by
the path of a YAML file in lm-eval's task format. Relative `dataset_kwargs.data_files` paths are
resolved against the YAML file's folder (lm-eval would resolve them against the working directory),
so a task folder can be moved or shipped as a whole. The prepared copies go into one folder that
lm-eval's `TaskManager(include_path=...)` indexes; nothing is read from the Hugging Face Hub.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kiln.platform.errors import InputError

SHIPPED_DIR = Path(__file__).parent / "tasks"
# lm-eval's output types that score by log-likelihood (need echo + logprobs and a tokenizer)
LOGLIKELIHOOD_TYPES = {"multiple_choice", "loglikelihood", "loglikelihood_rolling"}


class _Tag(str):
    """A `!function ...` (or other) tag: Python hooks beside the YAML, which a copy would lose."""


class _TaskLoader(yaml.SafeLoader):
    """Reads lm-eval YAML; tags are kept as `_Tag` strings so they can be reported."""


_TaskLoader.add_multi_constructor("!", lambda loader, suffix, node: _Tag(f"!{suffix}"))


def _find_tag(value: Any) -> str | None:
    if isinstance(value, _Tag):
        return str(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return next((t for t in map(_find_tag, items) if t), None)


@dataclass(frozen=True)
class TaskFile:
    name: str  # the `task:` lm-eval knows it by
    source: Path  # the YAML it came from
    output_type: str
    body: dict[str, Any]

    @property
    def loglikelihood(self) -> bool:
        return self.output_type in LOGLIKELIHOOD_TYPES


def shipped_tasks() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def _task_path(spec: str) -> Path:
    if spec in shipped_tasks():
        return SHIPPED_DIR / f"{spec}.yaml"
    path = Path(os.path.expanduser(spec))
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    raise InputError(
        f"evaluate.tasks: {spec!r} is neither a shipped task ({', '.join(shipped_tasks())}) "
        "nor a task YAML file"
    )


def _resolve_data_files(files: Any, base: Path, where: str) -> Any:
    if isinstance(files, str):
        path = Path(files) if os.path.isabs(files) else base / files
        if not path.is_file():
            raise InputError(f"{where}: data file {files} not found (looked for {path})")
        return str(path.resolve())
    if isinstance(files, list):
        return [_resolve_data_files(f, base, where) for f in files]
    if isinstance(files, dict):
        return {split: _resolve_data_files(f, base, where) for split, f in files.items()}
    raise InputError(f"{where}: dataset_kwargs.data_files must be a path, a list or a mapping")


def load_task(spec: str) -> TaskFile:
    """Read and check one task YAML; raises InputError with a one-line message if it is bad."""
    path = _task_path(spec)
    try:
        body = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskLoader)  # noqa: S506
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        raise InputError(f"{path}:{at} not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(body, dict) or not isinstance(body.get("task"), str):
        raise InputError(f"{path}: not an lm-eval task file (expected a mapping with `task:`)")
    tag = _find_tag(body)
    if tag:
        raise InputError(f"{path}: `{tag}` tags are not supported; use Jinja templates instead")
    if "include" in body:
        raise InputError(f"{path}: `include:` is not supported; write the task in one file")
    output_type = body.get("output_type", "generate_until")
    known = LOGLIKELIHOOD_TYPES | {"generate_until"}
    if output_type not in known:
        raise InputError(f"{path}: output_type {output_type!r} (expected one of {sorted(known)})")
    kwargs = body.get("dataset_kwargs") or {}
    if "data_files" in kwargs:
        body["dataset_kwargs"] = {
            **kwargs,
            "data_files": _resolve_data_files(kwargs["data_files"], path.parent, str(path)),
        }
    elif body.get("dataset_path") in ("json", "csv", "parquet", "text"):
        raise InputError(f"{path}: dataset_path {body['dataset_path']!r} needs data_files")
    return TaskFile(body["task"], path, output_type, body)


def prepare_tasks(specs: list[str], out_dir: Path) -> list[TaskFile]:
    """Check the named tasks and write lm-eval-ready copies (absolute data paths) to `out_dir`."""
    if not specs:
        raise InputError("evaluate.tasks: name at least one task (or set perplexity only)")
    tasks = [load_task(s) for s in specs]
    names = [t.name for t in tasks]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InputError(f"evaluate.tasks: task name {min(dup)!r} appears twice")
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in tasks:
        text = yaml.safe_dump(t.body, allow_unicode=True, sort_keys=False)
        (out_dir / f"{t.name}.yaml").write_text(text, encoding="utf-8")
    return tasks
