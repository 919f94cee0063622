"""The composition root's stage list: every built-in stage of every area, by import path (naming
a stage in a spec imports only its module). Imported with the `kiln` package."""

from __future__ import annotations

from kiln.platform.registry import register_builtin_stages, register_component

AREA_STAGES = {
    "sample.python_docs": "kiln.pipelines.samples:PythonDocsSample",
    "complete": "kiln.pipelines.complete_stage:CompleteStage",
    "compare": "kiln.pipelines.compare_stage:CompareStage",
    "curate": "kiln.curator.stage:CurateStage",
    "classify": "kiln.curator.classify.stage:ClassifyStage",
    "tokenize": "kiln.training.data.tokenize_stage:TokenizeStage",
    "train": "kiln.training.train_stage:TrainStage",
    "import-model": "kiln.training.post.stages:ImportModelStage",
    "prepare-chat": "kiln.training.post.stages:PrepareChatStage",
    "sft": "kiln.training.post.stages:SFTStage",
    "dpo": "kiln.training.post.stages:DPOStage",
    "export": "kiln.serving.export.stages:ExportStage",
    "serve": "kiln.serving.stages:ServeStage",
    "evaluate": "kiln.evaluate.stage:EvaluateStage",
}
# what one layer takes from another above it, by import path: evaluation starts serving's
# endpoint, the platform's `kiln stages` lists the model's presets
COMPONENTS = {
    "endpoint.launch": "kiln.serving.launch:launch",
    # `kiln stages` lists the model presets
    "model.config": "kiln.model.config:ModelConfig",
    "model.presets": "kiln.model.config:PRESETS",
}

register_builtin_stages(AREA_STAGES)
for _name, _target in COMPONENTS.items():
    register_component(_name, _target)
