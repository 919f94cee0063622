"""RL reward throughput: rewards scored per second, each next to a plain in-process baseline.

    .venv/bin/python bench/rl_rewards.py                # ~20 s
    .venv/bin/python bench/rl_rewards.py --code 64      # fewer sandbox runs

1. `math_exact` (kiln's GSM8K-style extraction through `RewardSet.score`) on completions for the
   shipped arithmetic held-out prompts, against the plainest grader: the last number in the
   text compared as a string (no markers, commas, \\boxed{} or per-reward failure handling).
2. The sandboxed `code` reward (a `python -I` subprocess with limits and an audit hook per
   completion; `RewardSet.score` runs them on a thread pool of `--workers`) against running the
   same code and asserts with `exec` in this process (no isolation, no limits). The ratio is
   the price of the sandbox; the same correct/wrong mix scores the same on both sides.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.training.rl.rewards import RewardSet  # noqa: E402
from kiln.training.rl.rewards.code_reward import extract_code  # noqa: E402
from kiln.training.rl.tasks.arithmetic import ArithmeticConfig, generate  # noqa: E402

LAST_NUMBER = re.compile(r"-?\d+")
SOLUTIONS = [  # (completion, tests): correct and wrong solutions of small functions
    (
        "```python\ndef add(a, b):\n    return a + b\n```",
        "assert add(2, 3) == 5\nassert add(-1, 1) == 0",
    ),
    ("```python\ndef add(a, b):\n    return a - b\n```", "assert add(2, 3) == 5"),
    (
        "```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n```",
        "assert fib(10) == 55\nassert [fib(i) for i in range(6)] == [0, 1, 1, 2, 3, 5]",
    ),
    (
        "```python\ndef is_prime(n):\n"
        "    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))\n```",
        "assert is_prime(97)\nassert not is_prime(91)\n"
        "assert sum(map(is_prime, range(1000))) == 168",
    ),
]


def rate(fn, n: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    values = fn()
    return n / (time.perf_counter() - start), values


def bench_math(n: int) -> None:
    rows = generate(ArithmeticConfig(train=1, held_out=128))["held_out"]
    rows = (rows * (n // len(rows) + 1))[:n]
    completions = [
        f"{r['prompt'][8:-50]} is computed step by step.\nAnswer: {int(r['answer']) + (i % 3 == 0)}"
        for i, r in enumerate(rows)
    ]
    prompts = [r["prompt"] for r in rows]
    rewards = RewardSet.from_specs([{"name": "math_exact"}])

    def kiln():
        return [r.total for r in rewards.score(prompts, completions, rows)]

    def plain():
        out = []
        for c, r in zip(completions, rows, strict=True):
            found = LAST_NUMBER.findall(c)
            out.append(float(bool(found) and found[-1] == r["answer"]))
        return out

    ours, our_values = rate(kiln, n)
    theirs, their_values = rate(plain, n)
    assert our_values == their_values, "the two graders disagree on plain 'Answer: N' lines"
    print(
        f"math_exact     kiln {ours:>10,.0f} rewards/s   plain last-number {theirs:>10,.0f} "
        f"rewards/s   ratio {ours / theirs:.2f}   (n={n}, mean reward {sum(our_values) / n:.3f})"
    )


def bench_code(n: int, workers: int) -> None:
    pairs = (SOLUTIONS * (n // len(SOLUTIONS) + 1))[:n]
    rows = [{"tests": tests} for _, tests in pairs]
    completions = [c for c, _ in pairs]
    rewards = RewardSet.from_specs([{"name": "code"}])

    def kiln():
        return [r.total for r in rewards.score(["p"] * n, completions, rows, max_workers=workers)]

    def in_process():
        out = []
        for completion, row in zip(completions, rows, strict=True):
            namespace: dict = {}
            try:
                exec(extract_code(completion), namespace)  # noqa: S102 - the unsandboxed baseline
                exec(row["tests"], namespace)  # noqa: S102
                out.append(1.0)
            except Exception:
                out.append(0.0)
        return out

    ours, our_values = rate(kiln, n)
    theirs, their_values = rate(in_process, n)
    assert our_values == their_values, "sandboxed and in-process scores differ"
    print(
        f"code           kiln sandboxed {ours:>8,.1f} rewards/s ({workers} workers)   in-process "
        f"exec {theirs:>10,.0f} rewards/s   ratio {ours / theirs:.4f}   (n={n})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--math", type=int, default=20000, help="math_exact completions")
    p.add_argument("--code", type=int, default=128, help="code completions")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="sandbox threads")
    args = p.parse_args()
    bench_math(args.math)
    bench_code(args.code, args.workers)


if __name__ == "__main__":
    main()
