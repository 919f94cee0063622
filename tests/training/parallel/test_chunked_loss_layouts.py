"""loss_chunk_tokens in the Trainer: the plain path's loss and gradients, alone, under FSDP and
under tensor parallelism (a vocabulary-sharded head)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from kiln.training.trainer import Trainer
from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import train_config


def first_step(parallel: dict) -> dict[int, tuple[float, dict[str, np.ndarray]]]:
    """Per loss_chunk_tokens (0: plain): the first step's loss and every full gradient (numpy:
    pickled by value between processes)."""
    out = {}
    for chunk in (0, 24):  # 24 does not divide the 64 tokens of a micro-batch
        torch.manual_seed(0)
        cfg = train_config(parallel, {"vocab_size": 512}).model_copy(
            update={"loss_chunk_tokens": chunk}
        )
        trainer = Trainer(cfg).setup()
        loss = trainer.train_step()["loss"]
        grads = {
            name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).numpy()
            for name, p in trainer.model_parts[0].named_parameters()
        }
        out[chunk] = (loss, grads)
    return out


def assert_same(a, b) -> None:
    assert abs(a[0] - b[0]) <= 1e-6
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        got, want = torch.from_numpy(a[1][name]), torch.from_numpy(b[1][name])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=name)


def test_one_process_chunked_equals_plain():
    runs = first_step({})
    assert_same(runs[24], runs[0])


@pytest.mark.slow
def test_dp_shard2_chunked_equals_plain_and_one_process():
    """The end-to-end proof under FSDP2 (2 gloo ranks; ~15 s on 2 busy cores)."""
    single = first_step({})
    per_rank = run_distributed(first_step, 2, {"dp_shard": 2}, timeout=600)
    for runs in per_rank:
        assert_same(runs[24], runs[0])
        assert_same(runs[24], single[0])


@pytest.mark.slow
def test_tp2_chunked_equals_plain_and_one_process():
    """The vocabulary-sharded chunked loss (2 gloo ranks, sequence-parallel hidden states)."""
    single = first_step({})
    per_rank = run_distributed(first_step, 2, {"tp": 2}, timeout=600)
    for runs in per_rank:
        assert_same(runs[24], runs[0])
        assert_same(runs[24], single[0])
