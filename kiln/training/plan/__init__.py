"""`kiln plan`: build a training config's model and layout as rank R of a real-size job, on one
CPU, and step it on fake tensors: per-rank memory (parameters, gradients, optimizer state,
activations under the configured recompute, peak), FLOPs and tokens per step.

    kiln plan kiln/pipelines/pretrain_gpt.yaml --ranks 0,31
    python -m kiln.training.plan kiln/pipelines/pretrain_gpt.yaml    # the same

It runs `Trainer.setup()` on PyTorch's fake process-group backend, so it fails with the same
one-line error a real run gives. Hardware-only choices (flash-attn, TE fp8) become SDPA / bf16.
MoE layers route as planned (kiln.training.plan.moe): balanced, owners at the capacity under
expert parallelism.
"""

from kiln.training.plan.cli import add_arguments, main, register, run
from kiln.training.plan.configs import cpu_stand_in, train_configs, world_size_of


def __getattr__(name: str):
    # memory imports torch: loaded on first use, so every `kiln` command (which registers
    # `kiln plan` through this package) does not pay torch's import
    if name in ("measure_step", "plan_rank", "plan_step"):
        from kiln.training.plan import memory

        return getattr(memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "add_arguments",
    "cpu_stand_in",
    "main",
    "measure_step",
    "plan_rank",
    "plan_step",
    "register",
    "run",
    "train_configs",
    "world_size_of",
]
