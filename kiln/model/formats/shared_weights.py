"""Exported weights as one safetensors file per block, hard-linking the blocks another export
already holds with the same tensors.

A LoRA fine-tune changes a few blocks of its base; a run folder holding the base export and the
merged fine-tune would otherwise keep two full copies. Here each block (`model-embed`, one
`model-layers-NNN` per transformer block, `model-head` for the final norm and output) is its own
file, listed in the standard `model.safetensors.index.json` that transformers, vLLM and kiln
read; a block whose tensors equal, bit for bit, a file of `share_from` with exactly the same
tensor names is a hard link to it instead of a copy. Files are never modified in place once
written, so a link is as good as a copy (and removing either folder keeps the other whole).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def block_of(hf_name: str) -> str:
    """The file a HF tensor name goes to: embed, layers-NNN or head."""
    if m := _LAYER.match(hf_name):
        return f"layers-{int(m.group(1)):03d}"
    return "embed" if hf_name.startswith("model.embed_tokens") else "head"


def _weight_map(folder: str | None) -> dict[str, str]:
    if not folder:
        return {}
    index = Path(folder) / INDEX
    try:
        return json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError):
        return {}


def _equal_file(folder: str, weight_map: dict[str, str], tensors: dict[str, torch.Tensor]):
    """The file of `folder` holding exactly these tensor names with equal values, or None."""
    from safetensors import safe_open

    files = {weight_map.get(name) for name in tensors}
    if len(files) != 1 or None in files:
        return None
    (file,) = files
    if {n for n, f in weight_map.items() if f == file} != set(tensors):
        return None
    path = os.path.join(folder, file)
    try:
        with safe_open(path, framework="pt") as f:
            for name, tensor in tensors.items():
                other = f.get_tensor(name)
                if other.dtype != tensor.dtype or not torch.equal(other, tensor):
                    return None
    except (OSError, ValueError, RuntimeError):
        return None
    return path


def _link(source: str, target: str) -> bool:
    try:
        if os.path.lexists(target):
            os.remove(target)
        os.link(source, target)
        return True
    except OSError:  # another filesystem, or links not allowed: write a copy instead
        return False


def write_blocks(
    hf_state: dict[str, torch.Tensor], out_dir: str, share_from: str | None = None
) -> dict:
    """Write the state as block files + index into `out_dir`; returns what was linked."""
    from safetensors.torch import save_file

    blocks: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for name, tensor in hf_state.items():
        blocks[block_of(name)][name] = tensor
    source_map = _weight_map(share_from)
    weight_map, linked, linked_bytes = {}, 0, 0
    for block, tensors in sorted(blocks.items()):
        file = f"model-{block}.safetensors"
        target = os.path.join(out_dir, file)
        same = _equal_file(share_from, source_map, tensors) if source_map else None
        if same and _link(same, target):
            linked += 1
            linked_bytes += os.path.getsize(target)
        else:
            save_file(tensors, target, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
    total = sum(t.numel() * t.element_size() for t in hf_state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    Path(out_dir, INDEX).write_text(json.dumps(index, indent=2))
    return {"block_files": len(blocks), "linked_files": linked, "linked_bytes": linked_bytes}


def link_or_copy_weights(source: str, target: str) -> str:
    """`shutil.copytree`'s copy_function: weight files are hard-linked (they are never changed
    in place), everything else copied (tokenizer configs may be edited afterwards)."""
    import shutil

    if source.endswith(".safetensors") and _link(source, target):
        return target
    return shutil.copy2(source, target)
