"""Run SFT/DPO in this process (one rank, or every rank under torchrun) and export the result.

`python -m kiln.training.post.run --config sft.yaml` under `torchrun --nproc-per-node N` runs
any layout; `kiln sft` / `kiln dpo` and the `sft` / `dpo` stages call `train_post` directly.
The export (rank 0) is a HF folder with the adapters merged (`<export>/hf`, chat template in
its tokenizer_config.json) and, for LoRA, the PEFT adapter folder (`<export>/adapter`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from kiln.model.config import ModelConfig
from kiln.model.formats.adapter_checkpoint import check_base
from kiln.model.formats.checkpoint import load_model_state, read_sidecar
from kiln.model.formats.hub import local_model
from kiln.model.formats.peft import export_peft_adapter
from kiln.model.formats.weights import read_weights
from kiln.model.fused_projections import fused_modules
from kiln.model.lora import LORA_PARAMS
from kiln.platform.config import load_body, override_paths, validate
from kiln.platform.errors import ConfigError, KilnError
from kiln.text.tokenizer import TOKENIZER_FILES
from kiln.training.checkpoint.resume import announce_resume
from kiln.training.launch import init_process_group_from_env
from kiln.training.post.config import PostTrainConfig
from kiln.training.post.lora_export import export_merged_hf
from kiln.training.post.trainer import PostTrainer, chat_prefix
from kiln.training.ray_train import train_on_ray


def _full_state(trainer) -> dict[str, torch.Tensor]:
    """The whole model's state on CPU (a collective under FSDP/TP: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    part = trainer.model_parts[0]
    if trainer.distributed and fused_modules(part):
        # torch's helper cannot name a fused module's parts (fused_projections.model_state_dict)
        state = part.state_dict()
        return {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in state.items()
        }
    if trainer.distributed:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(trainer.model_parts[0], options=options)
    return {k: v.detach().cpu() for k, v in trainer.model_parts[0].state_dict().items()}


def export_post(trainer, out_dir: str, chat_dir: str | None) -> dict[str, Any]:
    """Merged HF folder (+ PEFT adapter folder for LoRA) of a trained PostTrainer; rank 0 writes."""
    if trainer.dims.pp_enabled:
        raise ConfigError("export after post-training with pp > 1: export the checkpoint instead")
    state = _full_state(trainer)
    if trainer.rank != 0:
        return {}
    return export_state(trainer.cfg, state, out_dir, chat_dir)


def export_checkpoint(cfg: PostTrainConfig, ckpt: str, out_dir: str, chat_dir: str | None):
    """The same export from a run's checkpoint (full, or adapter-only on its referenced base)."""

    model_cfg, state = load_model_state(ckpt)
    ref = read_sidecar(ckpt).get("adapter_only")
    if ref:  # the adapters, on the base they were trained on
        check_base(read_sidecar(ckpt), ckpt, ref["base"])
        state = {**read_weights(ref["base"])[2], **state}

    cfg = cfg.model_copy(update={"model": ModelConfig(**model_cfg)})
    return export_state(cfg, state, out_dir, chat_dir)


def export_state(cfg: PostTrainConfig, state, out_dir: str, chat_dir: str | None) -> dict:
    """Write `<out>/hf` (adapters merged, chat template) and, for LoRA, `<out>/adapter`."""

    state = {k.replace("_orig_mod.", ""): v for k, v in state.items()}
    summary: dict[str, Any] = {}
    lora = cfg.lora
    if lora is not None:
        base = os.path.abspath(cfg.base) if cfg.base and os.path.exists(cfg.base) else cfg.base
        summary["adapter"] = export_peft_adapter(
            state, lora, os.path.join(out_dir, "adapter"), base
        )
    else:
        state = {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in LORA_PARAMS}
    tokenizer = (
        chat_dir if chat_dir and os.path.isfile(os.path.join(chat_dir, "tokenizer.json")) else None
    )
    hf_dir = os.path.join(out_dir, "hf")
    summary["hf"] = export_merged_hf(
        cfg.model.model_dump(),
        state,
        lora,
        hf_dir,
        tokenizer=tokenizer,
        share_from=_hf_of(cfg.base),
    )
    if tokenizer is not None:
        _add_chat_template(hf_dir, chat_dir, cfg.data.split)
    if lora is not None:  # `kiln serve out/adapter` (base + adapter) renders chats as hf/ does
        import shutil

        for name in (*TOKENIZER_FILES, "generation_config.json"):
            if os.path.isfile(os.path.join(hf_dir, name)):
                shutil.copyfile(os.path.join(hf_dir, name), os.path.join(out_dir, "adapter", name))
    return summary


def _hf_of(base: str | None) -> str | None:
    """The HF folder of a base (an ExportedModel's `hf/`, or the folder itself), if local."""
    if not base or not os.path.isdir(base):
        return None
    return os.path.join(base, "hf") if os.path.isdir(os.path.join(base, "hf")) else base


def _add_chat_template(hf_dir: str, chat_dir: str, split: str) -> None:
    """The template the data was rendered with goes into the export's tokenizer_config.json, so
    `apply_chat_template` and the chat endpoint render prompts as training saw them."""
    from pathlib import Path

    meta_file = Path(chat_dir) / f"{split}.chat.json"
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    if not meta.get("chat_template"):
        return
    config_file = Path(hf_dir) / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    config["chat_template"] = meta["chat_template"]
    end = meta.get("end_of_turn")
    if end:  # a chat model's end of sequence is the end of its turn (as SmolLM2-Instruct's)
        config["eos_token"] = end
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    generation = Path(hf_dir) / "generation_config.json"
    vocab = json.loads((Path(hf_dir) / "tokenizer.json").read_text())["model"]["vocab"]
    added = json.loads((Path(hf_dir) / "tokenizer.json").read_text()).get("added_tokens", [])
    ids = {t["content"]: t["id"] for t in added} | vocab
    if end in ids and generation.is_file():
        gen = json.loads(generation.read_text())
        eos = gen.get("eos_token_id")
        eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
        gen["eos_token_id"] = sorted({*eos, ids[end]})
        generation.write_text(json.dumps(gen, indent=2))


def train_post(cfg: PostTrainConfig, export_dir: str | None = None, on_step=None) -> dict:
    """Train (resuming from cfg.checkpoint.dir when it holds a checkpoint) and export."""

    if cfg.base:  # a Hub id: its snapshot folder (downloaded once, here)
        cfg = cfg.model_copy(update={"base": local_model(cfg.base)})
    resumed_from = announce_resume(cfg.checkpoint.dir)
    trainer = PostTrainer(cfg, on_step=on_step)
    history = trainer.train()
    summary: dict[str, Any] = {
        "objective": cfg.objective,
        "steps": trainer.step,
        "final": history[-1] if history else None,
        "first_loss": history[0]["loss"] if history else None,
        "resumed_from_step": resumed_from,
    }
    if export_dir:
        chat_dir = os.path.dirname(chat_prefix(trainer.cfg))
        summary["export"] = export_post(trainer, export_dir, chat_dir)
    return summary


def train_post_on_ray(
    cfg: PostTrainConfig, run_dir: str, options=None, export_dir: str | None = None, runtime=None
) -> dict:
    """The same run on Ray Train (one worker per rank, as `train` runs), then the export from
    its final checkpoint (in the driver: adapter-only checkpoints merge onto their base)."""

    absolute = {"paths": [os.path.abspath(p) for p in cfg.data.paths]}
    update: dict[str, Any] = {"data": cfg.data.model_copy(update=absolute)}
    base = local_model(cfg.base) if cfg.base else None  # a Hub id: downloaded here, once
    if base and os.path.exists(base):  # workers may run elsewhere on this node
        update["base"] = os.path.abspath(base)
    cfg = cfg.model_copy(update=update)
    result = train_on_ray(
        cfg, run_dir, options, runtime, trainer="kiln.training.post.trainer:PostTrainer"
    )
    final = result["final"] or {}
    summary: dict[str, Any] = {
        "objective": cfg.objective,
        "steps": final.get("step", 0),
        "final": final,
        "checkpoint": result["checkpoint"],
        "world_size": result["world_size"],
        "resumed_from_step": result["resumed_from_step"],
    }
    if export_dir:
        chat_dir = os.path.dirname(chat_prefix(cfg))
        summary["export"] = export_checkpoint(cfg, result["checkpoint"], export_dir, chat_dir)
    return summary


def load_config(path: str, overrides: list[str] | None = None, objective: str | None = None):
    """A PostTrainConfig from YAML (a `train:` block or the fields) with KEY=VALUE overrides."""

    body = load_body(path, block="train", overrides=overrides or [])
    if objective is not None:
        body["objective"] = objective
    blame = override_paths(overrides or [])  # a --set typo is the --set's, not the file's
    return validate(PostTrainConfig, body, prefix=objective or "post", source=path, overrides=blame)


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: every rank runs the same config."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kiln.training.post.run")
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--export", default=None, help="write the merged HF (+ adapter) here")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        init_process_group_from_env(cfg.device, cfg.optimizer_offload)
        summary = train_post(cfg, args.export)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(json.dumps(summary, indent=2, default=str))
    except KilnError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
