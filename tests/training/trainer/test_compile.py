"""Per-block torch.compile: on by default for CUDA runs, off on CPU; the compiled path trains
like the eager one."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config

from kiln.training.config import TrainConfig
from kiln.training.launch import resolve_auto_compile
from kiln.training.trainer import Trainer


def test_compile_is_on_by_default_on_cuda_only():
    auto = TrainConfig(device="auto")
    assert auto.parallel.compile is None
    assert resolve_auto_compile(auto, cuda_available=True).parallel.compile is True
    assert resolve_auto_compile(auto, cuda_available=False).parallel.compile is False
    on_cpu = TrainConfig(device="cpu")
    assert resolve_auto_compile(on_cpu, cuda_available=True).parallel.compile is False
    eager = TrainConfig(device="cuda", parallel={"compile": False})
    assert resolve_auto_compile(eager, cuda_available=True).parallel.compile is False


@pytest.mark.slow  # inductor builds C++ kernels: 61 s cold at load 18, 18 s with its disk cache
def test_compiled_blocks_train_like_eager(monkeypatch):
    # one compile worker: a pool of fresh interpreters costs more than this block's kernels
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)
    fields = {
        "model": {"preset": "tiny", "n_layers": 1},
        "device": "cpu",
        "seq_len": 16,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "steps": 2,
        "log_every": 1000,
    }
    eager = Trainer(TrainConfig(**fields)).train()
    trainer = Trainer(TrainConfig(**fields, parallel={"compile": True}))
    compiled = trainer.train()
    [block, *_] = trainer.model_parts[0].layers.values()
    assert block._compiled_call_impl is not None  # nn.Module.compile() in place
    for a, b in zip(eager, compiled, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
