"""The trainer takes its objective's hooks from a TrainSpec, never from overridden methods."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln.training
from kiln.model import Transformer
from kiln.training.parallel.loss import cross_entropy_loss
from kiln.training.train_spec import TrainSpec
from kiln.training.trainer import Trainer
from tests.training.trainer.layouts import tiny_config

# `type(self).m is not Base.m`, `Cls.m.__func__`, `m.__code__`, a class's own `__dict__`:
# the ways a class can ask which of its methods a subclass replaced
OVERRIDE_CHECK = re.compile(
    r"type\(self\)\.\w+\s+is\s|is\s+(not\s+)?\w*Trainer\.\w+|__func__|__code__"
    r"|vars\(type\(self\)\)|type\(self\)\.__dict__"
)


def test_a_custom_loss_hook_is_the_loss_the_trainer_reports():
    computed: list[float] = []

    def doubled(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = 2 * cross_entropy_loss(logits, labels)
        computed.append(float(loss.detach()))
        return loss

    cfg = tiny_config(steps=1)
    [plain] = Trainer(cfg).train()
    [hooked] = Trainer(cfg, spec=TrainSpec(loss=doubled)).train()
    assert len(computed) == 4  # global 8 / micro 2: four micro-batches, each through the hook
    assert hooked["loss"] == pytest.approx(sum(computed) / len(computed), rel=1e-6)
    assert hooked["loss"] == pytest.approx(2 * plain["loss"], rel=1e-5)


def test_a_model_adapter_gets_the_full_model_and_its_result_is_trained():
    seen: list[nn.Module] = []

    def adapter(model: nn.Module) -> nn.Module:
        assert isinstance(model, Transformer)
        assert not any(p.is_meta for p in model.parameters())  # real weights, not meta
        seen.append(model)
        return model

    trainer = Trainer(tiny_config(steps=1, meta_init=True), spec=TrainSpec(adapt_model=adapter))
    trainer.setup()
    assert seen and trainer.model_parts[0] is seen[0]


def test_nothing_in_kiln_training_checks_for_overridden_methods():
    assert OVERRIDE_CHECK.search("type(self)._accumulate_gradients is not Trainer._accumulate")
    assert OVERRIDE_CHECK.search("adapts = type(self).adapt_model is not Trainer.adapt_model")
    root = Path(kiln.training.__file__).parent
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if OVERRIDE_CHECK.search(line)
    ]
    assert not found, found
