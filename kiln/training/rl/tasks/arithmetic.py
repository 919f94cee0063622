"""A small verifiable arithmetic task for RL: seeded, with disjoint train and held-out splits.

Each row is `{"prompt": "Compute 37 + 45 * 2. ...Answer: <number>...", "answer": "127"}`: the
prompt asks for a final "Answer: N" line, which `math_exact` reads. Difficulty knobs: `digits`
(operands have 1..digits digits), `terms` (how many operands) and `operations` (a subset of
+ - *; usual precedence). The same config and seed always give the same rows.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kiln.platform.errors import ConfigError

Operation = Literal["+", "-", "*"]
PROMPT = "Compute {expression}. End your reply with a line 'Answer: <number>'."
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
SPLITS = ("train", "held_out")


class ArithmeticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    digits: int = Field(2, ge=1, le=9, description="Operands have 1..digits digits.")
    terms: int = Field(2, ge=2, le=8, description="Operands per problem.")
    operations: list[Operation] = Field(default_factory=lambda: ["+", "-", "*"], min_length=1)
    train: int = Field(512, ge=1, description="Training problems.")
    held_out: int = Field(128, ge=1, description="Held-out problems (none also in train).")


def evaluate(expression: str) -> int:
    """The value of an expression of integers and + - * (usual precedence)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    return value(ast.parse(expression, mode="eval").body)


def _problem(rng: random.Random, cfg: ArithmeticConfig) -> str:
    numbers = [rng.randint(0, 10 ** rng.randint(1, cfg.digits) - 1) for _ in range(cfg.terms)]
    ops = [rng.choice(cfg.operations) for _ in range(cfg.terms - 1)]
    parts = [str(numbers[0])]
    for op, n in zip(ops, numbers[1:], strict=True):
        parts += [op, str(n)]
    return " ".join(parts)


def generate(cfg: ArithmeticConfig) -> dict[str, list[dict]]:
    """{"train": rows, "held_out": rows}; no expression appears in both."""
    rng = random.Random(cfg.seed)
    wanted = cfg.train + cfg.held_out
    seen: dict[str, None] = {}  # insertion-ordered set: the draw order is the row order
    for _ in range(wanted * 50):
        seen.setdefault(_problem(rng, cfg))
        if len(seen) == wanted:
            break
    else:
        raise ConfigError(
            f"arithmetic: only {len(seen)} distinct problems with digits={cfg.digits}, "
            f"terms={cfg.terms}, operations={cfg.operations}; ask for fewer than {wanted} "
            "(train + held_out) or raise digits/terms"
        )
    rows = [{"prompt": PROMPT.format(expression=e), "answer": str(evaluate(e))} for e in seen]
    return {"train": rows[: cfg.train], "held_out": rows[cfg.train :]}


def write_splits(cfg: ArithmeticConfig, out_dir: str, prefix: str = "") -> dict[str, str]:
    """`{prefix}train.jsonl` and `{prefix}held_out.jsonl` under `out_dir`; their paths by split."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, rows in generate(cfg).items():
        path = os.path.join(out_dir, f"{prefix}{split}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        paths[split] = path
    return paths
