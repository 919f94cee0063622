"""Rank function: two real training steps of kiln's Trainer under torch's MemTracker."""

from __future__ import annotations

from kiln.training.config import TrainConfig

MOE = {"n_experts": 4, "top_k": 2}


def small_config(
    recompute: str, parallel: dict | None = None, model: dict | None = None
) -> TrainConfig:
    return TrainConfig(
        model={
            "preset": "tiny",
            "n_layers": 2,
            "dim": 128,
            "n_heads": 4,
            "n_kv_heads": 2,
            "ffn_hidden_dim": 256,
            "vocab_size": 512,
            **(model or {}),
        },
        parallel=parallel or {},
        seq_len=128,
        global_batch_size=4,
        micro_batch_size=2,
        steps=2,
        device="cpu",
        precision="fp32",
        data={"synthetic": True, "prefetch": 0},
        recompute=recompute,
        optimizer={"implementation": "foreach"},
    )


def measured_peak_bytes(cfg: TrainConfig) -> int:
    """Peak bytes of this rank over two optimizer steps (the second with optimizer state)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from kiln.training.trainer import Trainer

    trainer = Trainer(cfg).setup()
    tracker = MemTracker()
    tracker.track_external(*trainer.model_parts, *trainer.optimizers)
    forward_backward = trainer._forward_backward

    def tracked(*args):
        tracker.reset_mod_stats()  # MemTracker allows one call per module between resets
        return forward_backward(*args)

    trainer._forward_backward = tracked
    with tracker:
        trainer.train_step()
        trainer.train_step()
    peak = tracker.get_tracker_snapshot("peak")
    return sum(v for per_device in peak.values() for k, v in per_device.items() if k != "Total")


def measured_peaks(cfgs: list[TrainConfig]) -> list[int]:
    """measured_peak_bytes of each config in turn, in one process (MemTracker counts the tensors
    it tracks, not the process's memory, so an earlier run does not show in a later one)."""
    return [measured_peak_bytes(cfg) for cfg in cfgs]
