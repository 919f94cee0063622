"""prepare-chat -> sft (LoRA) -> prepare-chat (preference) -> dpo as a pipeline, wired by kind."""

from __future__ import annotations

import json
import os

import pytest

from kiln.platform.pipeline import Pipeline
from kiln.platform.registry import stage_class
from tests.training.post.helpers import chat_tokenizer
from tests.training.post.lora_helpers import export_base

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")


def test_finetune_pipeline_wires_chat_data_and_models_by_kind(tmp_path):
    _, base = export_base(str(tmp_path / "base"))
    chat_tokenizer().save(str(tmp_path / "tokenizer.json"))
    sft_rows = [{"prompt": f"fact {i}?", "response": f"fact {i} is paris"} for i in range(8)]
    pairs = [{"prompt": f"fact {i}?", "chosen": "paris", "rejected": "tokyo"} for i in range(8)]
    for name, rows in (("sft", sft_rows), ("pref", pairs)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = {
        "lora": {"rank": 4, "alpha": 8},
        "seq_len": 48,
        "global_batch_size": 4,
        "micro_batch_size": 4,
        "steps": 2,
        "device": "cpu",
        "eval_interval": 1,  # held-out loss (DPO: and reward accuracy) after every step
        "eval_batches": 1,
    }
    prepare, export = stage_class("prepare-chat"), stage_class("export")
    stages = [
        prepare(
            name="chat",
            source=str(tmp_path / "sft.jsonl"),
            tokenizer=str(tmp_path / "tokenizer.json"),
            seq_len=48,
            valid_fraction=0.25,
        ),
        stage_class("sft")(base=base, **train),
        prepare(
            name="prefs",
            source=str(tmp_path / "pref.jsonl"),
            format="preference",
            template="model",
            seq_len=48,
            valid_fraction=0.25,
        ),
        stage_class("dpo")(**train, dpo={"beta": 0.5}),
        export(name="sft_export", formats=["hf"], inputs={"checkpoint": "sft.model"}),
        export(name="dpo_export", formats=["hf"], inputs={"checkpoint": "dpo.model"}),
    ]
    pipeline = Pipeline("finetune-test", stages, runs_dir=str(tmp_path / "runs"))
    assert pipeline.wiring["dpo"] == {"data": "prefs.data", "model": "sft.model"}
    assert pipeline.wiring["prefs"]["model"] == "sft.model"
    result = pipeline.run(shutdown=False)
    assert result.record["status"] == "succeeded"
    # sft and dpo hand on adapter-only checkpoints; `export` writes them as HF + PEFT adapter
    for name in ("sft", "dpo"):
        assert result.artifact(f"{name}.model").kind == "Checkpoint"
        out = result.artifact(f"{name}_export.model").path
        assert os.path.isfile(os.path.join(out, "hf", "model.safetensors.index.json"))
        assert os.path.isfile(os.path.join(out, "adapter", "adapter_config.json"))
    assert "rewards/accuracies" in result.artifact("dpo.model").meta["final"]
    assert result.artifact("chat.data").counts["valid_rows"] == 2  # 8 conversations x 0.25
    # every step in the stage's metrics.jsonl (and TensorBoard), the held-out values with it
    for stage, keys in (("sft", {"val_loss"}), ("dpo", {"val_loss", "val_rewards/accuracies"})):
        rows = [json.loads(x) for x in (result.run_dir / stage / "metrics.jsonl").open()]
        assert [r["step"] for r in rows] == [1, 2]
        assert all(keys <= set(r) and 0 <= r.get("val_rewards/accuracies", 0) <= 1 for r in rows)
        assert any((result.run_dir / stage / "tensorboard").iterdir())
    # the preference data was rendered with the chat template the sft export carries
    meta = json.loads((tmp_path / "runs").rglob("train.chat.json").__next__().read_text())
    assert "<|im_start|>" in meta["chat_template"]


def test_finetune_yaml_and_its_sdk_twin_are_the_same_pipeline(tmp_path):
    from kiln.pipelines.finetune import build
    from kiln.platform.spec import load_pipeline

    from_yaml = load_pipeline("kiln/pipelines/finetune.yaml", runs_dir=str(tmp_path))
    from_sdk = build()

    def shape(p):
        return [(s.type_name, s.name, s.config.model_dump(mode="json")) for s in p.stages]

    assert shape(from_yaml) == shape(from_sdk)
    assert from_yaml.wiring == from_sdk.wiring
    assert from_yaml.wiring["dpo"] == {"data": "prefs.data", "model": "sft.model"}
    assert from_yaml.wiring["export"] == {"checkpoint": "dpo.model"}
    assert from_yaml.wiring["serve"] == {"model": "export.model"}


@pytest.mark.slow
def test_imported_model_template_gives_transformers_token_ids(
    smollm2, smollm2_checkpoint, tmp_path
):
    """SmolLM2-135M-Instruct from its GGUF (the session's `import-model` Checkpoint, wired as the
    `model` input): the shipped chat set rendered with the model's own template has the ids
    `apply_chat_template` gives on its HF export."""
    from transformers import AutoTokenizer

    from kiln.training.post.chat_dataset import ChatDataset
    from kiln.training.post.records import iter_rows, to_conversation

    shipped = "kiln/pipelines/data/finetune_sft.jsonl"
    stages = [
        stage_class("prepare-chat")(
            name="chat",
            source=shipped,
            template="model",
            seq_len=256,
            packing=False,
            inputs={"model": smollm2_checkpoint},
        ),
    ]
    result = Pipeline("import-test", stages, runs_dir=str(tmp_path)).run(shutdown=False)
    hf = os.path.join(smollm2, "hf")
    hf_tok = AutoTokenizer.from_pretrained(hf)
    ds = ChatDataset(os.path.join(result.artifact("chat.data").path, "train"))
    conversations = [to_conversation(row) for _, _, row in iter_rows(shipped)]
    assert len(ds) == len(conversations)
    stored = sorted(tuple(ds.sequences(r)[0][0].tolist()) for r in range(len(ds)))
    expected = []
    for messages in conversations:
        out = hf_tok.apply_chat_template(messages, tokenize=True, return_dict=True)
        expected.append(tuple(out["input_ids"]))
    assert stored == sorted(expected)
    assert "<|im_start|>" in hf_tok.decode(list(expected[0]))
