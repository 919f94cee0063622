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
    }
    prepare = stage_class("prepare-chat")
    stages = [
        prepare(
            name="chat",
            source=str(tmp_path / "sft.jsonl"),
            tokenizer=str(tmp_path / "tokenizer.json"),
            seq_len=48,
        ),
        stage_class("sft")(base=base, **train),
        prepare(
            name="prefs",
            source=str(tmp_path / "pref.jsonl"),
            format="preference",
            template="model",
            seq_len=48,
        ),
        stage_class("dpo")(**train, dpo={"beta": 0.5}),
    ]
    pipeline = Pipeline("finetune-test", stages, runs_dir=str(tmp_path / "runs"))
    assert pipeline.wiring["dpo"] == {"data": "prefs.data", "model": "sft.model"}
    assert pipeline.wiring["prefs"]["model"] == "sft.model"
    result = pipeline.run(shutdown=False)
    assert result.record["status"] == "succeeded"
    sft_out, dpo_out = result.artifact("sft.model").path, result.artifact("dpo.model").path
    for out in (sft_out, dpo_out):
        assert os.path.isfile(os.path.join(out, "hf", "model.safetensors"))
        assert os.path.isfile(os.path.join(out, "adapter", "adapter_config.json"))
    assert "rewards/accuracies" in result.artifact("dpo.model").meta["final"]
    # the preference data was rendered with the chat template the sft export carries
    meta = json.loads((tmp_path / "runs").rglob("train.chat.json").__next__().read_text())
    assert "<|im_start|>" in meta["chat_template"]
