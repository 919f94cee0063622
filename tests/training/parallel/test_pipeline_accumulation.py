"""Gradient accumulation under pipeline parallelism runs in one schedule step per optimizer
step (torch's schedule reduces gradients at the end of every step), built on fake ranks."""

from __future__ import annotations

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from kiln.training.config import TrainConfig
from kiln.training.trainer import Trainer


def test_one_schedule_step_carries_every_accumulation_micro_batch():
    cfg = TrainConfig(
        model={"preset": "tiny", "n_layers": 4},
        parallel={"pp": 2, "dp_shard": 2, "pp_microbatches": 2},
        seq_len=16,
        global_batch_size=16,
        micro_batch_size=2,
        device="cpu",
        precision="fp32",
        data={"synthetic": True, "prefetch": 0},
    )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        trainer = Trainer(cfg, dataloader=[]).setup()
    finally:
        dist.destroy_process_group()
    assert trainer.grad_accum == 4
    # pp_microbatches per accumulation micro-batch, all in one step
    assert trainer.schedule._n_microbatches == 2 * 4
    assert trainer._accumulates_in_schedule()
