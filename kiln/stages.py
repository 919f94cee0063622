"""The composition root's stage list: every built-in stage of every area, by import path into
the area's `stages` module (naming a stage in a spec imports only that area's stages).
Imported with the `kiln` package."""

from __future__ import annotations

from kiln.platform.registry import register_builtin_stages, register_component

AREA_STAGES = {
    "sample.python_docs": "kiln.pipelines.stages:PythonDocsSample",
    "complete": "kiln.pipelines.stages:CompleteStage",
    "compare": "kiln.pipelines.stages:CompareStage",
    "curate": "kiln.curator.stages:CurateStage",
    "classify": "kiln.curator.stages:ClassifyStage",
    "generate": "kiln.curator.stages:GenerateStage",
    "tokenize": "kiln.training.stages:TokenizeStage",
    "train": "kiln.training.stages:TrainStage",
    "import-model": "kiln.training.stages:ImportModelStage",
    "prepare-chat": "kiln.training.stages:PrepareChatStage",
    "sft": "kiln.training.stages:SFTStage",
    "dpo": "kiln.training.stages:DPOStage",
    "grpo": "kiln.training.stages:GRPOStage",
    "distill": "kiln.training.stages:DistillStage",
    "export": "kiln.serving.stages:ExportStage",
    "serve": "kiln.serving.stages:ServeStage",
    "evaluate": "kiln.evaluate.stages:EvaluateStage",
}
# what one layer takes from another above it, by import path: evaluation starts serving's
# endpoint, the platform's `kiln stages` lists the model's presets
COMPONENTS = {
    "endpoint.launch": "kiln.serving.launch:launch",
    # `kiln stages` lists the model presets
    "model.config": "kiln.model.config:ModelConfig",
    "model.presets": "kiln.model.presets:PRESETS",
}

register_builtin_stages(AREA_STAGES)
for _name, _target in COMPONENTS.items():
    register_component(_name, _target)
