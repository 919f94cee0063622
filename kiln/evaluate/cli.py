"""`kiln eval [MODEL_DIR] [--url URL] [--tokens DIR]`: lm-eval tasks + held-out perplexity."""

from __future__ import annotations

import os


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a model with lm-evaluation-harness through its REST endpoint, "
        "and its held-out perplexity",
        description="Run lm-eval tasks against an endpoint (--url, or one started for MODEL_DIR) "
        "and, with --tokens, the perplexity on a TokenDataset split. Writes metrics.json, "
        "report.md and lm_eval.log to --out.",
    )
    p.add_argument(
        "model_dir",
        metavar="MODEL_DIR",
        nargs="?",
        help="exported model (ExportedModel or Hugging Face folder): its tokenizer, perplexity, "
        "and the endpoint started when --url is not given",
    )
    p.add_argument("--url", help="a running endpoint's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--tokens", help="a TokenDataset folder (the tokenize stage's) for perplexity")
    p.add_argument(
        "--tasks",
        nargs="+",
        help="shipped task names or lm-eval task YAML files (default: kiln_mc_en kiln_mc_ja "
        "kiln_qa_gen); --tasks none for perplexity only",
    )
    p.add_argument("--api", choices=["completions", "chat"], default="completions")
    p.add_argument("--limit", type=int, help="at most this many items per task")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--num-concurrent", type=int, default=4)
    p.add_argument("--split", default="valid", help="perplexity split (default valid)")
    p.add_argument("--seq-len", type=int, help="perplexity window (default: the model's context)")
    p.add_argument("--api-key", default=os.environ.get("KILN_API_KEY"))
    p.add_argument(
        "--out", "--output", default=None, help="results folder (default runs/eval/<time>)"
    )
    p.add_argument("--address", help="Ray address when an endpoint is started (default: embedded)")
    p.set_defaults(handler="kiln.evaluate.commands:eval_command")
