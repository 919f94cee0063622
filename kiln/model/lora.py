"""LoRA as a module swap: each targeted `nn.Linear` becomes a `LoRALinear` before parallelize.

`LoRALinear` *is* an `nn.Linear` (same `weight`, same state-dict name) with two more parameters,
`lora_a` [rank, in] and `lora_b` [out, rank]:

    y = x W^T + (alpha / rank) * dropout(x) A^T B^T

as `peft`'s LoRA layer computes it (A Kaiming-uniform, B zero, so training starts at the base
model). Keeping the base weight's name means a base checkpoint loads unchanged, and the tensor-
parallel plan can shard A and B like their base weight (kiln/training/post/lora_parallel.py).
Only adapter parameters require grad, so only they get optimizer state.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from kiln.model.fused_projections import fused_modules
from kiln.model.moe import MoE
from kiln.platform.errors import ConfigError

LINEAR_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
LORA_PARAMS = ("lora_a", "lora_b")


class LoRAConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, gt=0, description="Adapter rank r.")
    alpha: float = Field(16.0, gt=0, description="Scaling numerator: updates are scaled alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    targets: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Linear layers to adapt: any of wq, wk, wv, wo, w1, w2, w3, or all-linear.",
    )

    layers: list[int] | None = Field(
        None,
        description="Adapt only these transformer blocks (negative counts from the end, e.g. "
        "[-8, -7, ...]); None: all. Gradients then stop at the lowest adapted block, so a step "
        "costs less.",
    )

    @field_validator("targets")
    @classmethod
    def _known(cls, v):
        if v == "all-linear":
            return v
        unknown = sorted(set(v) - set(LINEAR_TARGETS))
        if unknown or not v:
            raise ConfigError(
                f"lora.targets: {unknown or 'empty'} not in {list(LINEAR_TARGETS)} (or all-linear)"
            )
        return v

    @property
    def target_names(self) -> tuple[str, ...]:
        return LINEAR_TARGETS if self.targets == "all-linear" else tuple(self.targets)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _adapter_placements(weight_placements) -> dict[str, list]:
    """A's and B's placements, mesh dimension by mesh dimension, for a base weight's."""
    a = [Shard(1) if p == Shard(1) else Replicate() for p in weight_placements]
    b = [Shard(0) if p == Shard(0) else Replicate() for p in weight_placements]
    return {"lora_a": a, "lora_b": b}


class LoRALinear(nn.Linear):
    """A linear layer with a low-rank adapter; `weight` stays the (frozen) base weight."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        bias: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.rank, self.scaling = rank, alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=dtype))
        self.lora_b = nn.Parameter(torch.empty(out_features, rank, device=device, dtype=dtype))
        # a float, not an nn.Dropout child: torch's TP styles partition every submodule
        self.lora_dropout = dropout
        self.merged = False
        self.adapter_enabled = True
        self.reset_lora_parameters()

    @torch.no_grad()
    def reset_lora_parameters(self) -> None:
        """peft's init: A ~ Kaiming-uniform(a=sqrt(5)), B = 0 (the adapted model starts equal)."""
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b)

    @classmethod
    def from_linear(cls, base: nn.Linear, cfg: LoRAConfig) -> LoRALinear:
        w = base.weight
        layer = cls(
            base.in_features,
            base.out_features,
            cfg.rank,
            cfg.alpha,
            cfg.dropout,
            bias=base.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        layer.weight = base.weight  # the same Parameter: no copy, tied names stay tied
        if base.bias is not None:
            layer.bias = base.bias
        return layer

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        """Tensor parallelism (torch's Colwise/RowwiseParallel) re-registers `weight` as a
        DTensor; the adapters follow it: a column-parallel W [out, in] = Shard(0) gets A
        replicated and B Shard(0), a row-parallel W = Shard(1) gets A Shard(1) and B replicated,
        so x A^T B^T has the base output's layout (Shard(-1), or Partial before the reduce)."""
        super().register_parameter(name, param)
        weight = self._parameters.get("weight")
        if "lora_b" not in self._parameters or not isinstance(weight, DTensor):
            return
        targets = _adapter_placements(weight.placements)
        if name == "weight" and Shard(1) in weight.placements:
            # RowwiseParallel distributes only weight and bias: distribute the adapters here
            for key in LORA_PARAMS:
                current = self._parameters[key]
                if not isinstance(current, DTensor):
                    dist = distribute_tensor(current.detach(), weight.device_mesh, targets[key])
                    super().register_parameter(
                        key, nn.Parameter(dist, requires_grad=current.requires_grad)
                    )
        elif (
            name in LORA_PARAMS
            and isinstance(param, DTensor)
            and tuple(param.placements) != tuple(targets[name])  # ColwiseParallel sharded all
        ):
            moved = param.detach().redistribute(param.device_mesh, targets[name])
            super().register_parameter(name, nn.Parameter(moved, requires_grad=param.requires_grad))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.merged or not self.adapter_enabled:
            return out
        if self.lora_dropout > 0:
            x = F.dropout(x, self.lora_dropout, self.training)
        # scale the rank-r intermediate, not the [..., out] update: one small elementwise op
        h = F.linear(x, self.lora_a) * self.scaling
        if isinstance(out, DTensor) or isinstance(h, DTensor) or out.dim() < 2:
            return out + F.linear(h, self.lora_b)
        # B h added inside one GEMM (addmm): no [..., out] temporaries in forward or backward
        return torch.addmm(out.flatten(0, -2), h.flatten(0, -2), self.lora_b.t()).view(out.shape)

    def delta_weight(self) -> torch.Tensor:
        """scaling * B A: what merging adds to the base weight."""
        return (self.lora_b @ self.lora_a) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        if not self.merged:
            self.weight += self.delta_weight().to(self.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged:
            self.weight -= self.delta_weight().to(self.weight.dtype)
            self.merged = False

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scaling={self.scaling:g}"


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            yield name, module


def apply_lora(model: nn.Module, cfg: LoRAConfig, freeze_base: bool = True) -> list[str]:
    """Swap every targeted `nn.Linear` for a `LoRALinear` in place; freeze everything else.

    Call it on the whole model before pipeline carving and parallelize (A/B are then sharded with
    their layer). Returns the adapted module names; raises ConfigError when none matched.
    """
    ffn = sorted({"w1", "w2", "w3"} & set(cfg.targets if cfg.targets != "all-linear" else ()))
    if ffn and any(isinstance(m, MoE) for m in model.modules()):
        raise ConfigError(
            f"lora.targets {ffn}: a mixture-of-experts model's experts are grouped 3-D weights, "
            "not linear layers; target the attention projections (wq, wk, wv, wo)"
        )
    if fused_modules(model):
        raise ConfigError(
            "lora with model.fused_projections is not supported (the adapters target wq/wk/wv "
            "and w1/w3, which are fused); set model.fused_projections: false"
        )
    swapped = []
    blocks = _adapted_blocks(model, cfg.layers)
    for parent_name, parent in list(model.named_modules()):
        if blocks is not None and _block_of(parent_name) not in blocks:
            continue
        for child_name, child in list(parent.named_children()):
            if child_name in cfg.target_names and type(child) is nn.Linear:
                setattr(parent, child_name, LoRALinear.from_linear(child, cfg))
                swapped.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    if not swapped:
        raise ConfigError(f"lora.targets: no linear layer named {list(cfg.target_names)}")
    if freeze_base:
        for name, p in model.named_parameters():
            p.requires_grad_(name.rsplit(".", 1)[-1] in LORA_PARAMS)
    return swapped


def _block_of(module_name: str) -> int | None:
    """The transformer block index in a module name (`layers.12.attention` -> 12)."""
    parts = module_name.split(".")
    for a, b in zip(parts, parts[1:], strict=False):
        if a == "layers" and b.isdigit():
            return int(b)
    return None


def _adapted_blocks(model: nn.Module, layers: list[int] | None) -> set[int] | None:
    if layers is None:
        return None
    n = len({b for name, _ in model.named_modules() if (b := _block_of(name)) is not None})
    blocks = {i % n if -n <= i < n else -1 for i in layers}
    if -1 in blocks:
        raise ConfigError(f"lora.layers: {layers} out of range for {n} transformer blocks")
    return blocks


def init_lora_weights(model: nn.Module) -> None:
    """Re-initialise every adapter (after `to_empty()` on a model built on the meta device:
    the model's own `init_weights` knows nothing of A and B)."""
    for _, layer in lora_layers(model):
        layer.reset_lora_parameters()


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """The base model's forward (DPO reference log-probs without a second model in memory)."""
    layers = [layer for _, layer in lora_layers(model)]
    before = [layer.adapter_enabled for layer in layers]
    for layer in layers:
        layer.adapter_enabled = False
    try:
        yield model
    finally:
        for layer, was in zip(layers, before, strict=True):
            layer.adapter_enabled = was


def adapter_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Only the adapter entries of a (LoRA model's) state dict: what an adapter checkpoint holds."""
    return {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] in LORA_PARAMS}


def merged_state_dict(
    state: dict[str, torch.Tensor], scaling: float | dict[str, float]
) -> dict[str, torch.Tensor]:
    """A plain model's state dict: each adapted `weight` plus scaling * B A, adapters dropped.

    `scaling` is one value (alpha / rank) or a per-layer mapping `{layer name: scaling}`.
    """
    out = {}
    for name, tensor in state.items():
        if name.rsplit(".", 1)[-1] in LORA_PARAMS:
            continue
        layer = name.rsplit(".", 1)[0]
        a, b = state.get(f"{layer}.lora_a"), state.get(f"{layer}.lora_b")
        if name.endswith(".weight") and a is not None and b is not None:
            s = scaling[layer] if isinstance(scaling, dict) else scaling
            tensor = tensor + (b.float() @ a.float() * s).to(tensor.dtype)
        out[name] = tensor
    return out
