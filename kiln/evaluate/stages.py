"""The `evaluate` stage: lm-evaluation-harness tasks against an endpoint, plus held-out perplexity.

    - stage: evaluate
      config: {tasks: [kiln_mc_en, kiln_mc_ja, kiln_qa_gen], api: completions}

Inputs (all optional, wired to the latest earlier output of their kind): `endpoint` (a running
`serve` stage's Endpoint), `model` (an ExportedModel: its tokenizer for log-likelihood tasks, the
model for perplexity, and the endpoint this stage starts when there is no `endpoint` or `url`),
`tokens` (a TokenDataset: perplexity on its `valid` split). Output `metrics`: metrics.json,
report.md, lm_eval_results.json, lm_eval_samples.jsonl, lm_eval.log and the prepared task files.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from kiln.evaluate.config import EvaluateConfig
from kiln.evaluate.harness import require_harness
from kiln.evaluate.run import api_key_from_env, evaluate, summary
from kiln.platform.stage import Stage, StageContext


class EvaluateStage(Stage):
    """Score a model with lm-eval through its REST endpoint, and its perplexity on held-out
    tokens."""

    type_name = "evaluate"
    Config = EvaluateConfig
    input_kinds: ClassVar[dict[str, str]] = {
        "endpoint": "Endpoint",
        "model": "ExportedModel",
        "tokens": "TokenDataset",
    }
    optional_inputs: ClassVar[frozenset[str]] = frozenset({"endpoint", "model", "tokens"})
    output_kinds: ClassVar[dict[str, str]] = {"metrics": "EvalResults"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config.tasks:  # when the pipeline is built, before its first stage runs
            require_harness(f"{self.name}.tasks")

    def extra_fingerprint(self) -> str:
        # an external URL may serve another model tomorrow: never reuse its scores
        return f"url@{time.time_ns()}" if self.config.url else ""

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg: EvaluateConfig = self.config  # type: ignore[assignment]
        inputs = ctx.inputs
        url = cfg.url or (inputs["endpoint"].meta["url"] if "endpoint" in inputs else None)
        out = ctx.outputs["metrics"]
        result = evaluate(
            cfg,
            Path(out.path),
            url=url,
            model_dir=inputs["model"].path if "model" in inputs else None,
            tokens_dir=inputs["tokens"].path if "tokens" in inputs else None,
            api_key=api_key_from_env(cfg.api_key_env),
            ensure_ray=ctx.ray,
        )
        out.counts = {
            "tasks": len(result["tasks"]),
            "items": sum(s["samples"] or 0 for s in result["tasks"].values()),
        }
        return summary(result)
