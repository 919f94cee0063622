"""Loader batches pinned for a non-blocking copy where a CUDA device takes them; plain elsewhere."""

from __future__ import annotations

import pytest
import torch

from kiln.training.data.loader import TokenLoader
from kiln.training.data.sources import SyntheticSource
from kiln.training.trainer import Trainer
from tests.training.parallel._trainer_cases import train_config


def loader(pin_memory: bool) -> TokenLoader:
    source = SyntheticSource(vocab_size=100, seq_len=16, seed=3)
    return TokenLoader(source, seq_len=16, micro_batch_size=2, pin_memory=pin_memory)


def test_a_cpu_trainer_leaves_its_batches_unpinned():
    given = loader(pin_memory=True)
    trainer = Trainer(train_config({}, {}), dataloader=given).setup()
    assert trainer.dataloader is given and given.pin_memory is False
    tokens, labels = trainer._next_batch()
    assert tokens.device.type == "cpu" and not tokens.is_pinned()
    assert torch.equal(tokens[:, 1:], labels[:, :-1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_batches_equal_the_plain_ones():
    pinned, plain = next(iter(loader(True))), next(iter(loader(False)))
    assert all(t.is_pinned() for t in pinned)
    for a, b in zip(pinned, plain, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(a.to("cuda", non_blocking=True).cpu(), b)
