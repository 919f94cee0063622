"""Distributed checkpoints (torch.distributed.checkpoint) that reshard on load."""

from kiln.platform.imports import lazy_exports
from kiln.training.checkpoint.config import CheckpointConfig

EXPORTS = {
    "Checkpointer": "kiln.training.checkpoint.checkpointer:Checkpointer",
    "latest_checkpoint": "kiln.model.formats.checkpoint:latest_checkpoint",
    "load_model_state": "kiln.model.formats.checkpoint:load_model_state",
    "read_sidecar": "kiln.model.formats.checkpoint:read_sidecar",
}
__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = ["CheckpointConfig", *EXPORTS]
