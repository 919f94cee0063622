"""kiln.training: token datasets, every parallelism, the optimizer, checkpoints, the training loop,
post-training and the Ray Train glue. `train(cfg)` (launcher.py) runs a TrainConfig here or under
torchrun."""

from kiln.platform.imports import lazy_exports

EXPORTS = {"train": "kiln.training.launcher:train"}
__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = [*EXPORTS]
