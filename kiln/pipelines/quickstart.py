"""The quickstart written with the SDK: the same stages and settings as quickstart.yaml.

python -m kiln.pipelines.quickstart [--steps N]
"""

from __future__ import annotations

import argparse

from kiln import Pipeline, stage_class


def build(steps: int = 300) -> Pipeline:
    stage = stage_class
    return Pipeline(
        "quickstart",
        [
            stage("sample.python_docs")(name="sample"),
            stage("curate")(filters={"languages": ["en", "ja"]}, stream="inline"),
            stage("tokenize")(vocab_size=2048, valid_fraction=0.02, test_fraction=0.0),
            stage("train")(
                model={"preset": "tiny", "vocab_size": 2048, "max_seq_len": 256},
                parallel={"tp": 2, "pp": 2, "dp_shard": 1, "pp_schedule": "1f1b"},
                seq_len=128,
                global_batch_size=8,
                micro_batch_size=2,
                steps=steps,
                optimizer={"lr": 3e-3, "weight_decay": 0.01},
                schedule={"kind": "cosine", "warmup_steps": min(20, steps)},
                checkpoint={"interval_steps": 100, "async": True, "keep_last": 2},
                log_every=10,
            ),
            stage("export")(formats=["hf", "triton"], model_name="kiln-quickstart"),
            stage("serve")(),
            stage("complete")(prompts=["The Python language", "Pythonは"], max_tokens=48),
        ],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    result = build(ap.parse_args().steps).run()
    print(f"run directory: {result.run_dir}")


if __name__ == "__main__":
    main()
