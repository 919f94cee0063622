"""The composition root's own stages, over other areas' artifacts: `complete` and `compare`
(the quickstart's last steps) and the sample text stages (kiln/pipelines/samples.py).

`complete` sends prompts to a live Endpoint and prints the completions.

`compare` asks the same chat questions to the base model (in this process) and to the served,
tuned model (over /v1/chat/completions), printed side by side. `expect` names, per question, a
few words the tuned answer should hold (the taught facts): the stage reports how many answers
hold theirs (`taught`), and `require_taught` fails the stage when one does not.
"""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from kiln.engine.generator import Generator, SamplingParams
from kiln.pipelines.samples import PythonDocsSample
from kiln.platform.errors import KilnError
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.serving.chat_template import render_chat
from kiln.serving.client import KilnClient
from kiln.text.chat_template import end_of_turn_markers, load_chat_config

__all__ = ["CompareStage", "CompleteStage", "PythonDocsSample"]


class CompleteConfig(StageConfig):
    prompts: list[str] = Field(
        default_factory=lambda: ["The Python language"], description="Prompts to send."
    )
    max_tokens: int = Field(48, ge=1, description="New tokens per completion.")
    temperature: float = Field(0.0, ge=0, description="0: greedy.")
    api_key_env: str | None = Field(
        None, description="Environment variable holding the endpoint's API key."
    )


class CompleteStage(Stage):
    """Ask the endpoint for one completion per prompt over its OpenAI-compatible route and print
    them."""

    type_name = "complete"
    Config = CompleteConfig
    input_kinds: ClassVar[dict[str, str]] = {"endpoint": "Endpoint"}
    output_kinds: ClassVar[dict[str, str]] = {"completions": "Text"}
    cacheable: ClassVar[bool] = False

    def run(self, ctx: StageContext) -> dict[str, Any]:
        meta = ctx.inputs["endpoint"].meta
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        client = KilnClient(meta["url"], api_key=key)
        results = []
        for prompt in self.config.prompts:
            text = client.complete(
                prompt, max_tokens=self.config.max_tokens, temperature=self.config.temperature
            )
            results.append({"prompt": prompt, "completion": text})
            print(f"\n>>> {prompt}{text}\n", flush=True)
        out = ctx.outputs["completions"]
        (Path(out.path) / "completions.json").write_text(
            json.dumps(results, indent=2, ensure_ascii=False)
        )
        out.counts = {"completions": len(results)}
        return {"url": meta["url"], "completions": len(results)}


class CompareConfig(StageConfig):
    questions: list[str] = Field(
        default_factory=lambda: ["What is the name of Kiln's mascot?"],
        description="User turns, each asked to both models (one-turn chats).",
    )
    expect: list[list[str]] = Field(
        default_factory=list,
        description="Per question, words one of which the tuned answer must contain.",
    )
    require_taught: bool = Field(False, description="Fail when a tuned answer lacks its words.")
    max_tokens: int = Field(32, ge=1, description="New tokens per answer.")


class TaughtFactsMissing(KilnError):
    """A tuned answer lacks the fact it was taught."""


def holds(answer: str, words: list[str]) -> bool:
    return not words or any(w.lower() in answer.lower() for w in words)


def side_by_side(rows: list[dict[str, Any]], width: int | None = None, max_lines: int = 2) -> str:
    """Question, then the base and tuned answers in two wrapped columns (CJK counts double),
    each cut at `max_lines` (answers.json keeps them whole)."""
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 120)
    col = (width - 3) // 2
    lines = [_pad("base model", col) + " | tuned model"]
    for r in rows:
        lines.append("-" * width)
        lines.append(f"Q: {r['question']}")
        left, right = _wrap(r["base"], col)[:max_lines], _wrap(r["tuned"], col)[:max_lines]
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else ""
            b = right[i] if i < len(right) else ""
            lines.append(f"{_pad(a, col)} | {b}")
    return "\n".join(lines)


def _cells(ch: str) -> int:
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _pad(text: str, cells: int) -> str:
    return text + " " * max(cells - sum(map(_cells, text)), 0)


def _wrap(text: str, cells: int) -> list[str]:
    """Greedy wrap by display cells: at spaces, and anywhere inside a word wider than a line
    (Japanese has no spaces)."""
    lines, line, used = [], "", 0
    for word in " ".join(text.split()).split(" "):
        pieces = [word] if sum(map(_cells, word)) <= cells else list(word)
        for i, piece in enumerate(pieces):
            w, sep = sum(map(_cells, piece)), 1 if line and i == 0 else 0
            if used + sep + w > cells and line:
                lines.append(line)
                line, used, sep = "", 0, 0
            line += " " * sep + piece
            used += sep + w
    return [*lines, line] if line else lines or [""]


class CompareStage(Stage):
    """Ask the base model and the served tuned model the same questions; print both answers."""

    type_name = "compare"
    Config = CompareConfig
    input_kinds: ClassVar[dict[str, str]] = {"base": "ExportedModel", "endpoint": "Endpoint"}
    output_kinds: ClassVar[dict[str, str]] = {"answers": "Text"}
    cacheable: ClassVar[bool] = False

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg: CompareConfig = self.config
        chats = [[{"role": "user", "content": q}] for q in cfg.questions]
        base = self._base_answers(ctx.inputs["base"].path, chats)
        with KilnClient(ctx.inputs["endpoint"].meta["url"]) as client:
            tuned = [client.chat(c, max_tokens=cfg.max_tokens, temperature=0.0) for c in chats]
        rows = []
        for i, q in enumerate(cfg.questions):
            words = cfg.expect[i] if i < len(cfg.expect) else []
            taught = holds(tuned[i], words)
            rows.append({"question": q, "base": base[i], "tuned": tuned[i], "taught": taught})
        print("\n" + side_by_side(rows), flush=True)
        out = ctx.outputs["answers"]
        (Path(out.path) / "answers.json").write_text(json.dumps(rows, indent=2, ensure_ascii=False))
        n_taught = sum(r["taught"] for r in rows)
        out.counts = {"questions": len(rows), "taught": n_taught}
        missing = [r["question"] for r in rows if not r["taught"]]
        if missing and cfg.require_taught:
            raise TaughtFactsMissing(f"{self.name}: tuned answers lack their facts: {missing}")
        return {"questions": len(rows), "taught": n_taught}

    def _base_answers(self, base_dir: str, chats: list[list[dict[str, str]]]) -> list[str]:
        """The base model's greedy answers, its own chat template rendering the prompts."""
        hf = (
            os.path.join(base_dir, "hf")
            if os.path.isdir(os.path.join(base_dir, "hf"))
            else base_dir
        )
        gen = Generator.load(hf, device="cpu")
        template, special = load_chat_config(gen.tokenizer_dir)
        prompts = [render_chat(c, template, special) for c in chats]
        params = SamplingParams(
            max_new_tokens=self.config.max_tokens, stop=end_of_turn_markers(template, special)
        )
        # a cut-off answer may end inside a multi-byte character: drop its replacement marks
        return [c.text.strip().rstrip("\ufffd") for c in gen.generate(prompts, params)]
