"""The `export` stage: a Checkpoint (+ Tokenizer) -> an ExportedModel with `hf/`, `triton/` and
`gguf/<model_name>.<gguf_type>.gguf`, and for a LoRA run's adapter-only checkpoint `adapter/` (a
PEFT adapter folder on its base). The only stage that writes HF / Triton / GGUF: every stage that
produces a model writes a Checkpoint.

- name: export
  type: export
  inputs: {checkpoint: train.checkpoint, tokenizer: tokenize.tokenizer}
  config: {formats: [hf, triton, gguf], gguf_type: q8_0, triton: {max_batch_size: 8}}
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from kiln.model.formats.adapter_checkpoint import adapter_reference
from kiln.model.formats.checkpoint import is_checkpoint, read_checkpoint
from kiln.model.formats.checkpoint_tokenizer import has_tokenizer
from kiln.model.formats.peft import export_peft_adapter
from kiln.model.lora import LoRAConfig
from kiln.model.quantize import QuantMethod
from kiln.platform.console import Progress
from kiln.platform.errors import ConfigError, InputError
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.serving.export.compare import compare, load_for_compare
from kiln.serving.export.convert import open_model
from kiln.serving.export.gguf import export_gguf
from kiln.serving.export.hf import export_hf
from kiln.serving.export.triton import TritonExportConfig, export_triton
from kiln.text.tokenizer import TOKENIZER_FILES


class ExportConfig(StageConfig):
    formats: list[Literal["hf", "triton", "gguf"]] = Field(
        default_factory=lambda: ["hf", "triton"], min_length=1, description="What to write."
    )
    model_name: str = Field(
        "kiln", pattern=r"^[A-Za-z0-9_.-]+$", description="The served model's name."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weight dtype on disk."
    )
    gguf_type: Literal["f32", "f16", "bf16", "q8_0"] = Field(
        "f32", description="GGUF tensor type (q8_0: 2-D weights quantised, the rest f32)."
    )
    quantize: QuantMethod | None = Field(
        None,
        description="Serve the Triton model with quantized weights (sets triton.quantize; the "
        "files keep `dtype`). GGUF carries its own (gguf_type: q8_0); HF weights stay float.",
    )
    check_tokens: int = Field(
        8,
        ge=0,
        description="Run this many tokens through each written hf/gguf model and the source and "
        "record the largest logit difference in the metrics (0: no check).",
    )
    triton: TritonExportConfig = Field(
        default_factory=TritonExportConfig,
        description="Triton model config (model_name follows the stage's).",
    )


class ExportStage(Stage):
    """Write a checkpoint as a Hugging Face model (`hf/`), a Triton repository (`triton/`) and a
    GGUF file; a LoRA run's adapter-only checkpoint also as its PEFT adapter (`adapter/`)."""

    type_name = "export"
    Config = ExportConfig
    input_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint", "tokenizer": "Tokenizer"}
    optional_inputs: ClassVar[frozenset[str]] = frozenset({"tokenizer"})
    output_kinds: ClassVar[dict[str, str]] = {"model": "ExportedModel"}

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg: ExportConfig = self.config
        t0 = time.perf_counter()
        checkpoint = ctx.inputs["checkpoint"].path
        # a checkpoint that carries its tokenizer (import-model, train from one, sft, dpo) keeps
        # it and its chat template; the Tokenizer input is for one without (a `train` from
        # scratch on the `tokenize` stage's tokenizer)
        wired = ctx.inputs["tokenizer"].path if "tokenizer" in ctx.inputs else None
        tokenizer = None if has_tokenizer(checkpoint) else wired
        out = ctx.outputs["model"]
        summary = export_model(checkpoint, out.path, cfg, tokenizer=tokenizer)
        out.counts = {"parameters": summary["parameters"]}
        out.meta = {k: v for k, v in summary.items() if k != "parameters"}
        ctx.log.debug(  # the terminal's line is the stage's own "done" line
            "exported %s (%s parameters) to %s",
            summary["architecture"],
            summary["parameters"],
            out.path,
        )
        checks = {k: v for k, v in summary.items() if k.startswith("check_")}
        return {"export_s": round(time.perf_counter() - t0, 3), **out.counts, **checks}


def export_model(
    checkpoint: str, out_dir: str, cfg: ExportConfig, *, tokenizer: str | None = None
) -> dict:
    """What the stage and `kiln export` do: `<out>/hf` first, then `<out>/triton` from it,
    `<out>/gguf/<model_name>.<gguf_type>.gguf` from the checkpoint (and `<out>/adapter` for an
    adapter-only checkpoint)."""
    if cfg.quantize and "triton" not in cfg.formats:
        raise ConfigError(
            f"export.quantize: {cfg.quantize} is carried by the triton format only (formats: "
            f"{cfg.formats}); GGUF has gguf_type: q8_0, and `kiln serve --quantize` quantizes hf/"
        )
    needs_hf = "hf" in cfg.formats or "triton" in cfg.formats
    steps = needs_hf + ("triton" in cfg.formats) + ("gguf" in cfg.formats)
    with Progress(steps, "export", unit="formats") as progress:
        result = {"model_name": cfg.model_name, "formats": list(cfg.formats)}
        if needs_hf:
            result.update(_export(checkpoint, out_dir, cfg, tokenizer, progress))
        if "gguf" in cfg.formats:
            gguf = _export_gguf(checkpoint, out_dir, cfg, tokenizer)
            # hf's architecture name (LlamaForCausalLM) when both, else llama.cpp's (llama)
            result = {"architecture": gguf["gguf_architecture"], **gguf, **result}
            progress.advance(1, "gguf")
    adapter = (
        _export_adapter(checkpoint, out_dir) if needs_hf and is_checkpoint(checkpoint) else None
    )
    if adapter is not None:
        result["adapter"] = adapter
    if needs_hf and "hf" not in cfg.formats:  # hf/ was only the way to triton
        shutil.rmtree(os.path.join(out_dir, "hf"))
        result.pop("hf_dir")
    if cfg.check_tokens:
        written = {"hf": result.get("hf_dir"), "gguf": result.get("gguf_file")}
        written = {k: os.path.join(out_dir, v) for k, v in written.items() if v}
        result.update(check_export(checkpoint, written, cfg.check_tokens))
    return result


def check_export(checkpoint: str, written: dict[str, str], tokens: int) -> dict[str, float]:
    """`check_<format>_max_logit_diff` of each written model against the source on `tokens`
    fixed token ids (exported vs the weights as read, float32 on the CPU)."""
    with open_model(checkpoint) as (cfg, state, _, _):
        source = load_for_compare(cfg, state)
    n = min(tokens, cfg.max_seq_len)
    ids = [(7919 * i + 1) % cfg.vocab_size for i in range(n)]  # spread over the vocabulary
    figures = {}
    for fmt, path in written.items():
        with open_model(path) as (cfg_w, state_w, _, _):
            exported = load_for_compare(cfg_w, state_w)
        result = compare(source, exported, [ids], greedy_tokens=0)
        figures[f"check_{fmt}_max_logit_diff"] = result.max_logit_diff
    return figures


def _export_gguf(checkpoint: str, out_dir: str, cfg: ExportConfig, tokenizer) -> dict:
    name = f"{cfg.model_name}.{cfg.gguf_type}.gguf"
    summary = export_gguf(
        checkpoint,
        os.path.join(out_dir, "gguf", name),
        tokenizer=tokenizer,
        gguf_type=cfg.gguf_type,
        name=cfg.model_name,
    )
    summary["gguf_architecture"] = summary.pop("architecture")
    summary.pop("gguf_type")
    return {"gguf_file": f"gguf/{name}", "gguf_type": cfg.gguf_type, **summary}


def _export_adapter(checkpoint: str, out_dir: str) -> dict | None:
    """`<out>/adapter`, the PEFT folder of an adapter-only checkpoint on the base it names, with
    hf/'s tokenizer files so `kiln serve out/adapter` renders chats as hf/ does; None for a
    checkpoint that carries its own weights."""
    ref = adapter_reference(checkpoint)
    if ref is None:
        return None
    _, adapters = read_checkpoint(checkpoint)
    adapter_dir = os.path.join(out_dir, "adapter")
    summary = export_peft_adapter(adapters, LoRAConfig(**ref["lora"]), adapter_dir, ref["base"])
    hf_dir = os.path.join(out_dir, "hf")
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        if os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copyfile(os.path.join(hf_dir, name), os.path.join(adapter_dir, name))
    return summary


def _export(checkpoint: str, out_dir: str, cfg: ExportConfig, tokenizer, progress) -> dict:
    hf_dir = os.path.join(out_dir, "hf")
    summary = export_hf(  # per-block files: a LoRA fine-tune of it links the blocks it keeps
        checkpoint,
        hf_dir,
        tokenizer=tokenizer,
        dtype=cfg.dtype,
        model_name=cfg.model_name,
        blocks=True,
    )
    progress.advance(1, "hf")
    result = {
        "architecture": summary["architecture"],
        "parameters": summary["parameters"],
        "hf_dir": "hf",
    }
    if "triton" in cfg.formats:
        if not os.path.exists(os.path.join(hf_dir, "tokenizer.json")):
            raise InputError(
                "export: the triton format needs a tokenizer "
                "(inputs.tokenizer, or tokenizer.json next to the checkpoint)"
            )
        update = {"model_name": cfg.model_name, "dtype": cfg.dtype}
        if cfg.quantize:
            update["quantize"] = cfg.quantize
        triton_cfg = cfg.triton.model_copy(update=update)
        export_triton(hf_dir, os.path.join(out_dir, "triton"), triton_cfg)
        result["triton_repo"] = "triton"
        progress.advance(1, "triton")
    return result
