"""Validation during training: the held-out loss of the eval split every `eval_interval` steps
and after the last, equal to the same loss computed by hand from the trained model; logged in
the metrics file; the same value under data and pipeline parallelism (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kiln.platform.errors import ConfigError
from kiln.text.indexed_dataset import IndexedDatasetWriter
from kiln.training.data import build_dataloader
from kiln.training.data.config import DataConfig
from kiln.training.parallel.loss import cross_entropy_loss
from kiln.training.trainer import Trainer
from tests.training.distributed import run_distributed
from tests.training.trainer.layouts import tiny_config


def _token_dataset(root, valid_docs: int = 6):
    """A TokenDataset folder with train/ and valid/ splits of random documents."""
    rng = np.random.default_rng(3)
    root.mkdir(exist_ok=True)
    for split, docs in (("train", 40), ("valid", valid_docs)):
        writer = IndexedDatasetWriter(str(root / split), np.uint16)
        for _ in range(docs):
            writer.add_sequence(rng.integers(1, 200, rng.integers(20, 60)))
            writer.end_document()
        writer.finalize()
    return str(root)


def _cfg(data: str, **over):
    fields = {
        "steps": 5,
        "eval_interval": 2,
        "eval_batches": 3,
        "model": {"preset": "tiny", "n_layers": 2},
        "data": DataConfig(paths=[data], prefetch=0),
        "device": "cpu",
    }
    return tiny_config(**{**fields, **over})


def test_validation_loss_at_the_interval_matches_the_model(tmp_path):
    data = _token_dataset(tmp_path / "tokens")
    metrics_file = tmp_path / "metrics.jsonl"
    trainer = Trainer(_cfg(data, metrics_file=str(metrics_file))).setup()
    history = trainer.train()
    assert [m["step"] for m in history if "val_loss" in m] == [2, 4, 5]  # interval, then last
    logged = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [m.get("val_loss") for m in logged] == [m.get("val_loss") for m in history]
    # by hand: the trained model on the valid split's first eval_batches micro-batches
    cfg = trainer.cfg
    loader = build_dataloader(
        cfg.data.model_copy(update={"split": "valid"}),
        seq_len=cfg.seq_len,
        micro_batch_size=cfg.micro_batch_size,
        dp_rank=0,
        dp_size=1,
        seed=cfg.seed,
    )
    with torch.no_grad():
        losses = [
            cross_entropy_loss(trainer.model_parts[0](x), y)
            for x, y in (next(loader) for _ in range(cfg.eval_batches))
        ]
    assert history[-1]["val_loss"] == pytest.approx(float(torch.stack(losses).mean()), abs=1e-6)
    assert history[-1]["val_loss"] != pytest.approx(history[1]["val_loss"], abs=1e-6)  # trained


def test_validation_without_a_valid_split_is_a_config_error(tmp_path):
    data = _token_dataset(tmp_path / "tokens", valid_docs=0)
    with pytest.raises(ConfigError, match="eval_interval: no validation data in split 'valid'"):
        Trainer(_cfg(data)).setup()


def _val_losses(**over) -> list[float]:
    """Each step's val_loss of a synthetic-data run (in this process; distributed if a process
    group is up)."""
    torch.set_num_threads(1)
    cfg = tiny_config(steps=2, eval_interval=1, **over)
    return [m["val_loss"] for m in Trainer(cfg).train()]


def _layouts(layouts: list[dict]) -> list[list[float]]:
    return [_val_losses(**layout) for layout in layouts]


@pytest.mark.slow
def test_validation_is_the_same_under_data_and_pipeline_parallelism():
    """8 held-out samples each time: one process reads 4 micro-batches of 2, dp_shard=2 reads 2
    per rank (averaged over ranks), pp=2 one schedule step of 4 (forward-only `eval`), tp=2
    the same 4 on both ranks (vocabulary-parallel loss)."""
    reference = _val_losses(eval_batches=4)
    layouts = [
        {"eval_batches": 2, "parallel": {"dp_shard": 2}},
        {"eval_batches": 4, "parallel": {"pp": 2, "dp_shard": 1, "pp_schedule": "1f1b"}},
        {"eval_batches": 4, "parallel": {"tp": 2, "dp_shard": 1}},
    ]
    per_rank = run_distributed(_layouts, 2, layouts, timeout=600)
    assert per_rank[0] == per_rank[1]  # every rank logs the global value
    for name, losses in zip(("dp_shard2", "pp2_1f1b", "tp2"), per_rank[0], strict=True):
        assert losses == pytest.approx(reference, abs=1e-5), name
