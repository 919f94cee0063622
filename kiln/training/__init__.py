"""kiln.training: token datasets, every parallelism, the optimizer, checkpoints, the training loop,
post-training and the Ray Train glue. `train(cfg)` (launcher.py) runs a TrainConfig here or under
torchrun."""

from kiln.training.launcher import train

__all__ = ["train"]
