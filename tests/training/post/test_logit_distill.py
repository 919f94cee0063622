"""Logit distillation as an sft option: a frozen teacher's logits on the chat data pull the
student toward the teacher; unsupported combinations and a foreign teacher are ConfigErrors."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.model.formats.weights import write_model_checkpoint
from kiln.platform.errors import ConfigError
from kiln.training.data.config import DataConfig
from kiln.training.post.chat_dataset import ChatDataset
from kiln.training.post.config import PostTrainConfig
from kiln.training.post.logit_distill import LogitDistillConfig, logit_distill_loss
from kiln.training.post.prepare import prepare_chat
from kiln.training.post.trainer import PostTrainer
from tests.engine.tiny import tiny_model
from tests.training.post.helpers import chat_tokenizer
from tests.training.post.lora_helpers import VOCAB, export_base

SEQ = 48


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    _, hf = export_base(str(root / "student"))
    for name, vocab in (("teacher", VOCAB), ("wide", VOCAB + 16)):
        teacher = tiny_model("llama", vocab, seed=5)
        write_model_checkpoint(str(root / name), teacher.cfg.model_dump(), teacher.state_dict())
    rows = [{"prompt": f"what is fact {i}?", "response": f"fact {i} is paris"} for i in range(8)]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_chat(root / "sft.jsonl", root / "chat", tokenizer=chat_tokenizer(), seq_len=SEQ)
    return {"hf": hf, "chat": str(root / "chat"), "root": root}


def _cfg(data, teacher="teacher", **over) -> PostTrainConfig:
    fields = {
        "base": data["hf"],
        "seq_len": SEQ,
        "global_batch_size": 4,
        "micro_batch_size": 4,
        "steps": 4,
        "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
        "schedule": {"kind": "constant"},
        "data": DataConfig(paths=[data["chat"]]),
        "device": "cpu",
        "distill": {"teacher": str(data["root"] / teacher), "weight": 1.0},
        **over,
    }
    return PostTrainConfig(**fields)


@torch.no_grad()
def _divergence_on_all_rows(trainer: PostTrainer, data) -> float:
    ds = ChatDataset(f"{data['chat']}/train")
    tokens, labels, positions, _ = (
        torch.from_numpy(a) for a in ds.gather_rows(list(range(len(ds))))[:4]
    )
    model = trainer.model_parts[0]
    _, metrics = logit_distill_loss(
        model(tokens), trainer.teacher(tokens), labels, trainer.cfg.distill
    )
    return metrics["distill/divergence"]


def test_logit_distillation_pulls_the_student_toward_the_teacher(data):
    trainer = PostTrainer(_cfg(data)).setup()
    before = _divergence_on_all_rows(trainer, data)
    history = trainer.train()
    after = _divergence_on_all_rows(trainer, data)
    assert after < 0.7 * before, (before, after)  # measured: 3.08 -> 1.72
    assert all("distill/divergence" in m and "distill/ce" in m for m in history)


def test_distill_loss_mixes_cross_entropy_and_divergence():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 9), torch.randn(2, 5, 9)
    labels = torch.tensor([[-100, 1, 2, 3, -100], [4, 5, -100, -100, 6]])
    cfg = LogitDistillConfig(teacher="t", weight=0.25, temperature=2.0)
    loss, m = logit_distill_loss(student, teacher, labels, cfg)
    trained = labels != -100
    ce = torch.nn.functional.cross_entropy(student[trained], labels[trained])
    p, q = (student[trained] / 2).log_softmax(-1), (teacher[trained] / 2).log_softmax(-1)
    forward = (q.exp() * (q - p)).sum(-1).mean()
    torch.testing.assert_close(loss, 0.75 * ce + 0.25 * 4.0 * forward)
    assert m["distill/ce"] == pytest.approx(float(ce))


def test_unsupported_distillation_setups_are_config_errors(data):
    with pytest.raises(ConfigError, match="sft option"):
        _cfg(data, objective="dpo")
    with pytest.raises(ConfigError, match="parallel.pp, cp or tp"):
        _cfg(data, parallel={"tp": 2})
    with pytest.raises(ConfigError, match=r"distill\.teacher: .*vocabulary"):
        PostTrainer(_cfg(data, teacher="wide")).setup()
