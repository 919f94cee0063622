"""Post-training's HF export: the trained weights, LoRA adapters merged in, written straight as a
Hugging Face folder (kiln.model.formats.hf); the PEFT adapter folder is kiln.model.formats.peft."""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.hf import write_hf_dir
from kiln.model.lora import LORA_PARAMS, LoRAConfig, merged_state_dict
from kiln.text.tokenizer import find_tokenizer


def export_merged_hf(
    model_cfg: dict,
    state: dict[str, torch.Tensor],
    cfg: LoRAConfig | None,
    out_dir: str,
    *,
    tokenizer=None,
    dtype: str = "float32",
    share_from: str | None = None,
) -> dict:
    """Adapters merged into the base weights (`cfg` None: a full fine-tune, nothing to merge),
    written as a HF model directory with `tokenizer` (a path or a Tokenizer), if given, one file
    per block: the blocks equal to those of the HF folder `share_from` (the base) are hard links
    to its files."""
    merged = merged_state_dict(state, cfg.scaling) if cfg is not None else dict(state)
    if model_cfg.get("tie_embeddings"):
        merged.pop("output.weight", None)
    assert not any(k.rsplit(".", 1)[-1] in LORA_PARAMS for k in merged)
    tok, tok_dir = find_tokenizer(tokenizer, []) if tokenizer is not None else (None, None)
    return write_hf_dir(
        ModelConfig(**model_cfg),
        merged,
        out_dir,
        tok=tok,
        tok_dir=tok_dir,
        dtype=dtype,
        blocks=True,
        share_from=share_from,
    )
