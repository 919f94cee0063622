"""The `export` stage: a Checkpoint (+ Tokenizer) -> an ExportedModel with `hf/`, `triton/` and
`gguf/<model_name>.<gguf_type>.gguf`.

- name: export
  type: export
  inputs: {checkpoint: train.checkpoint, tokenizer: tokenize.tokenizer}
  config: {formats: [hf, triton, gguf], gguf_type: q8_0, triton: {max_batch_size: 8}}
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from kiln.platform.console import Progress
from kiln.platform.errors import InputError
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.serving.export.gguf import export_gguf
from kiln.serving.export.triton import TritonExportConfig


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
    triton: TritonExportConfig = Field(
        default_factory=TritonExportConfig,
        description="Triton model config (model_name follows the stage's).",
    )


class ExportStage(Stage):
    """Write a checkpoint as a Hugging Face model (`hf/`) and a Triton repository (`triton/`)."""

    type_name = "export"
    Config = ExportConfig
    input_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint", "tokenizer": "Tokenizer"}
    optional_inputs: ClassVar[frozenset[str]] = frozenset({"tokenizer"})
    output_kinds: ClassVar[dict[str, str]] = {"model": "ExportedModel"}

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg: ExportConfig = self.config
        t0 = time.perf_counter()
        tokenizer = ctx.inputs["tokenizer"].path if "tokenizer" in ctx.inputs else None
        out = ctx.outputs["model"]
        summary = export_model(ctx.inputs["checkpoint"].path, out.path, cfg, tokenizer=tokenizer)
        out.counts = {"parameters": summary["parameters"]}
        out.meta = {k: v for k, v in summary.items() if k != "parameters"}
        ctx.log.debug(  # the terminal's line is the stage's own "done" line
            "exported %s (%s parameters) to %s",
            summary["architecture"],
            summary["parameters"],
            out.path,
        )
        return {"export_s": round(time.perf_counter() - t0, 3), **out.counts}


def export_model(
    checkpoint: str, out_dir: str, cfg: ExportConfig, *, tokenizer: str | None = None
) -> dict:
    """What the stage and `kiln export` do: `<out>/hf` first, then `<out>/triton` from it, and
    `<out>/gguf/<model_name>.<gguf_type>.gguf` from the checkpoint."""
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
    if needs_hf and "hf" not in cfg.formats:  # hf/ was only the way to triton
        import shutil

        shutil.rmtree(os.path.join(out_dir, "hf"))
        result.pop("hf_dir")
    return result


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


def _export(checkpoint: str, out_dir: str, cfg: ExportConfig, tokenizer, progress) -> dict:
    from kiln.serving.export.hf import export_hf
    from kiln.serving.export.triton import export_triton

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
        triton_cfg = cfg.triton.model_copy(
            update={"model_name": cfg.model_name, "dtype": cfg.dtype}
        )
        export_triton(hf_dir, os.path.join(out_dir, "triton"), triton_cfg)
        result["triton_repo"] = "triton"
        progress.advance(1, "triton")
    return result
