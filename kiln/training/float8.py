"""fp8 training without Transformer Engine: torchao's Float8Linear (the path torchtitan uses).

Each selected block Linear becomes a `torchao.float8.Float8Linear`. Forward casts the input and
the weight to float8 e4m3 with scales from their current amax (one per tensor with `tensorwise`,
one per row with `rowwise`), multiplies them with `torch._scaled_mm` and returns the input's
dtype (bf16 in a real run); backward casts the output gradient (e5m2 with `tensorwise`, e4m3 with
`rowwise`) and runs the two gradient GEMMs the same way. Inputs and weights are kept in high
precision for backward, so activation memory is bf16's (`kiln plan` plans an fp8 run as bf16).

Why it composes where te.Linear does not: Float8Linear is an `nn.Linear` subclass that keeps the
original weight Parameter, so the model converts on the meta device, torch's TP plan shards it
into DTensors (the amax of a shard becomes a DTensor reduction) and FSDP2 shards it like any
Linear. Scales are computed per call (no amax history), so pipeline stages need nothing from
each other.

torchao is imported only here and only when fp8 runs (it takes seconds to import); it comes
with `kiln[gpu]` (and `kiln[test]`).
"""

from __future__ import annotations

import torch
from torch import nn

from kiln.platform.errors import ConfigError
from kiln.platform.extras import require_extra
from kiln.training.precision import (
    FP8_MIN_CAPABILITY,
    check_fp8_layout,
    check_te_available,
    fp8_linear_names,
)


def check_fp8(cfg, device: torch.device) -> None:
    """precision: fp8's layout and its backend's availability, as one-line errors before any
    model is built: Transformer Engine, or torchao's scaled matmuls on `device`."""
    check_fp8_layout(cfg)
    if cfg.fp8_backend == "te":
        check_te_available()
    else:
        check_float8_available(device)


def check_float8_available(device: torch.device) -> None:
    """torchao is installed (else a one-line MissingExtraError) and `device` runs its scaled
    matmuls: a CUDA GPU of capability 8.9+ (Ada, Hopper or newer), or the CPU (torch's oneDNN
    `_scaled_mm`: for tests and rehearsals, not for speed)."""
    require_extra("gpu", ("torchao",), "precision: fp8 (fp8_backend: torchao)")
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_MIN_CAPABILITY:
            raise ConfigError(
                f"precision=fp8 needs compute capability >= 8.9, this GPU has {capability} "
                "(use precision: bf16)"
            )
    elif device.type != "cpu":
        raise ConfigError(f"precision=fp8 runs on CUDA (or CPU for tests), not {device.type}")


def convert_to_float8(
    model: nn.Module, recipe: str, tp: int = 1, fsdp_all_gather: bool = False
) -> list[str]:
    """Swap `fp8_linear_names(model)` for Float8Linear in place (meta or real weights alike);
    returns the names swapped. Under tensor parallelism every shard must keep fp8's multiple-of-16
    sizes, so a Linear is kept only if its sizes divide by 16 * `tp`. `fsdp_all_gather`
    (tensorwise): the weights become tensors FSDP2 all-gathers already cast to fp8."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if fsdp_all_gather:
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    else:
        config = Float8LinearConfig.from_recipe_name(recipe)
    names = set(fp8_linear_names(model, multiple=16 * tp))
    convert_to_float8_training(
        model, config=config, module_filter_fn=lambda _module, fqn: fqn in names
    )
    return sorted(names)


def precompute_float8_scales(model_parts: list[nn.Module]) -> None:
    """After an optimizer step under fp8 all-gather: every fp8 weight's scale from its new amax,
    in one all-reduce for all of them (instead of one per weight as each is gathered)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for part in model_parts:
        precompute_float8_dynamic_scale_for_fsdp(part)
