"""Evaluation: lm-evaluation-harness (the `lm-eval` package) against Kiln's REST endpoint, on task
files shipped in `kiln/evaluate/tasks/`, plus held-out perplexity on a TokenDataset split.

    from kiln.evaluate import EvaluateConfig, evaluate
    evaluate(EvaluateConfig(), "runs/eval/1", model_dir="runs/q/…/export/model")

The `evaluate` stage and `kiln eval` are thin wrappers over `evaluate` (kiln.evaluate.run).
"""

from kiln.evaluate.config import EvaluateConfig, PerplexityConfig
from kiln.platform.imports import lazy_exports

EXPORTS = {"evaluate": "kiln.evaluate.run:evaluate"}
__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = ["EvaluateConfig", "PerplexityConfig", *EXPORTS]
