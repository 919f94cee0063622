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

from kiln.platform.imports import lazy_exports

EXPORTS = {
    "cpu_stand_in": "kiln.training.plan.configs:cpu_stand_in",
    "measure_step": "kiln.training.plan.memory:measure_step",
    "plan_rank": "kiln.training.plan.memory:plan_rank",
    "plan_step": "kiln.training.plan.memory:plan_step",
    "train_configs": "kiln.training.plan.configs:train_configs",
    "world_size_of": "kiln.training.plan.configs:world_size_of",
}
__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = [*EXPORTS]
