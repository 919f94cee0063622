"""One PEFT LoRA adapter read for serving over a base model the engine already holds: its A and
B per adapted linear layer, B pre-multiplied by the adapter's scaling (alpha / r), so a forward
adds x A^T (sB)^T and nothing else.

The folder is what `kiln sft` with LoRA (kiln.model.formats.peft) and `peft`'s `save_pretrained`
write; every tensor is checked against the served model's layers here, so a bad adapter fails
its load (a 400 naming `lora_path`), never a forward.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import torch
from torch import nn

from kiln.model.formats.peft import CONFIG_FILE, WEIGHTS_FILE, read_peft_tensors
from kiln.platform.errors import InputError

_uids = itertools.count(1)


@dataclass(eq=False)
class LoRAAdapter:
    """`layers` maps a module name (`layers.0.attention.wq`) to (A [r, in], s*B [out, r]) on the
    CPU in the model's dtype. `uid` is new at every load: a name loaded again with other weights
    never shares cached prefixes with its previous self."""

    name: str
    path: str
    rank: int
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]
    uid: int = field(default_factory=lambda: next(_uids))

    @property
    def cache_key(self) -> str:
        """What keeps this adapter's cached KV blocks apart from the base's and other adapters'
        (a prefix's keys/values differ per adapter)."""
        return f"lora-{self.uid}"


def read_lora_adapter(name: str, path: str, model: nn.Module, max_rank: int) -> LoRAAdapter:
    """The adapter in PEFT folder `path`, checked against `model`: every tensor must adapt one
    of its linear layers with matching widths, and its rank be at most `max_rank`."""
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise InputError(f"lora_path: {path!r} is not a PEFT adapter folder (no {CONFIG_FILE})")
    if not os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
        raise InputError(f"lora_path: {path!r} has no {WEIGHTS_FILE}")
    try:
        config, tensors, scaling = read_peft_tensors(path)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"lora_path: {path!r} is not a readable PEFT adapter ({e})") from None
    except InputError as e:
        raise InputError(f"lora_path: {e}") from None
    rank = int(config["r"])
    if rank > max_rank:
        raise InputError(
            f"lora_path: {path!r} has rank {rank}; this server takes up to max_lora_rank {max_rank}"
        )
    dtype = model.tok_embeddings.weight.dtype
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key in sorted({k.rsplit(".", 1)[0] for k in tensors}):
        a, b = tensors.get(f"{key}.lora_a"), tensors.get(f"{key}.lora_b")
        if a is None or b is None:
            raise InputError(f"lora_path: {path!r} has only one of lora_A/lora_B for {key}")
        module = _module(model, key)
        width = (getattr(module, "in_features", None), getattr(module, "out_features", None))
        if module is None or None in width:
            raise InputError(f"lora_path: {path!r} adapts {key}, which the served model lacks")
        if a.shape != (rank, width[0]) or b.shape != (width[1], rank):
            raise InputError(
                f"lora_path: {path!r}: {key} A {tuple(a.shape)} / B {tuple(b.shape)} do not fit "
                f"the served model's layer ({width[1]} x {width[0]}) at rank {rank}"
            )
        layers[key] = (a.to(dtype).contiguous(), (b.double() * scaling).to(dtype).contiguous())
    if not layers:
        raise InputError(f"lora_path: {path!r} holds no LoRA tensors")
    return LoRAAdapter(name, path, rank, layers)


def _module(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None
