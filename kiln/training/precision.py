"""Precision: single-process bf16/fp16 autocast, fp8's layout rules and its Transformer Engine
backend, fp16 loss scaling.

Distributed runs get bf16/fp16 from FSDP2's MixedPrecisionPolicy instead (see parallelize).
fp8's default backend, torchao's Float8Linear, is in float8.py.
"""

from __future__ import annotations

import contextlib
import importlib.util

import torch
from torch import nn

from kiln.model.moe import MoE
from kiln.platform.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with fp8 tensor cores


def autocast_context(precision: str, device_type: str, distributed: bool):
    """Autocast for one process (FSDP casts parameters itself when distributed)."""
    if precision == "fp32" or distributed:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=DTYPES[precision])


def check_te_available() -> None:
    """fp8_backend=te needs Transformer Engine and an fp8-capable GPU (Hopper / Ada or newer)."""
    if importlib.util.find_spec("transformer_engine") is None:
        raise ConfigError(
            "precision=fp8 with fp8_backend=te needs Transformer Engine: pip install "
            "transformer-engine[pytorch] (or fp8_backend: torchao)"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            "precision=fp8 needs a CUDA GPU (Hopper or Ada or newer); none is visible"
        )
    if torch.cuda.get_device_capability() < FP8_MIN_CAPABILITY:
        raise ConfigError(
            "precision=fp8 needs compute capability >= 8.9, this GPU has "
            f"{torch.cuda.get_device_capability()}"
        )


def check_fp8_layout(cfg) -> None:
    """The layouts fp8 runs on (docs/gpu.md says why), from a TrainConfig alone.

    torchao (the default) runs on every layout whose per-rank sequence suits fp8 GEMMs.
    Transformer Engine runs with data, context and expert parallelism only:
    pp: the schedule runs every stage's modules many times inside one step while TE reduces amax
    over the whole world at the end of each autocast region, which pipeline peers never join.
    tp: a swapped te.Linear is not a DTensor, so torch's TP plan cannot shard it.
    """
    if cfg.fp8_backend != "te":
        # the weight-gradient GEMM's inner dimension is this rank's tokens, and fp8 GEMMs take
        # multiples of 16 only
        local_seq = cfg.seq_len // cfg.parallel.cp
        if local_seq % 16:
            raise ConfigError(
                f"precision=fp8 needs seq_len / parallel.cp ({local_seq}) to be a multiple of 16"
            )
        return
    for name in ("pp", "tp"):
        if getattr(cfg.parallel, name) > 1:
            raise ConfigError(
                f"precision=fp8 with fp8_backend=te is not supported with parallel.{name} > 1 "
                "(use fp8_backend: torchao; docs/gpu.md)"
            )


def fp8_linear_names(model: nn.Module, multiple: int = 16) -> list[str]:
    """The block Linears that run in fp8: attention and dense FFN projections.

    Left out: the output head, the MoE gate and every expert (routed chunks have arbitrary row
    counts, which fp8 GEMMs refuse unless divisible by 8/16), and any Linear whose sizes are not
    multiples of `multiple` (16: the fp8 GEMMs' shape rule, for each tensor-parallel shard).
    """

    names = []
    for block_name, block in model.layers.items():
        moe_prefixes = [n for n, m in block.named_modules() if isinstance(m, MoE)]
        for name, child in block.named_modules():
            if type(child) is not nn.Linear:
                continue
            if any(name == p or name.startswith(p + ".") for p in moe_prefixes if p):
                continue
            if child.in_features % multiple or child.out_features % multiple:
                continue
            names.append(f"layers.{block_name}.{name}")
    return names


def swap_to_te_linear(model: nn.Module) -> None:
    """Replace `fp8_linear_names(model)` with te.Linear (weights and biases copied)."""
    import transformer_engine.pytorch as te

    for name in fp8_linear_names(model):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        child = getattr(parent, attr)
        new = te.Linear(
            child.in_features,
            child.out_features,
            bias=child.bias is not None,
            params_dtype=child.weight.dtype,
            device=child.weight.device,
        )
        with torch.no_grad():
            new.weight.copy_(child.weight)
            if child.bias is not None:
                new.bias.copy_(child.bias)
        setattr(parent, attr, new)


def fp8_context(cfg):
    """te.fp8_autocast with a delayed- or current-scaling recipe under fp8_backend=te (nothing
    otherwise: torchao's Float8Linear scales inside each call)."""
    if cfg.precision != "fp8" or cfg.fp8_backend != "te":
        return contextlib.nullcontext()
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe

    if cfg.fp8_scaling == "delayed":
        fp8_recipe = te_recipe.DelayedScaling(
            fp8_format=te_recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max"
        )
    else:
        fp8_recipe = te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID)
    return te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)


class LossScaler:
    """Dynamic loss scaling for fp16: skip the step and halve on overflow, double after a clean run.

    The overflow check reuses the global grad norm, so every rank makes the same decision.
    """

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 2000):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self._clean_steps = 0

    def unscale_(self, params) -> None:
        if self.enabled:
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, 1.0 / self.scale)

    def update(self, grad_norm: torch.Tensor) -> bool:
        """Returns whether the optimizer may step (gradients are finite)."""
        if not self.enabled:
            return True
        if not torch.isfinite(grad_norm):
            self.scale /= 2
            self._clean_steps = 0
            return False
        self._clean_steps += 1
        if self._clean_steps % self.growth_interval == 0:
            self.scale *= 2
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self._clean_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self._clean_steps = state["scale"], state["clean_steps"]
