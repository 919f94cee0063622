"""Distributed checkpoints (torch.distributed.checkpoint) that reshard on load."""

from kiln.training.checkpoint.config import CheckpointConfig

__all__ = [
    "CheckpointConfig",
    "Checkpointer",
    "latest_checkpoint",
    "load_model_state",
    "read_sidecar",
]


def __getattr__(name):  # keep `import kiln.training.checkpoint` light (no torch) for config users
    if name == "Checkpointer":
        from kiln.training.checkpoint.checkpointer import Checkpointer

        return Checkpointer
    if name in ("latest_checkpoint", "load_model_state", "read_sidecar"):
        from kiln.model.formats import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(name)
