"""Kiln: raw text to a served language model, on Ray.

The SDK: compose stages into a pipeline and run it.

    from kiln import Pipeline, stage_class
    Pipeline("demo", [stage_class("text.read")(paths=["docs/"]), stage_class("text.stats")()]).run()
"""

from kiln import cli as _cli  # noqa: E402, F401 - the areas' commands (composition root)
from kiln import stages as _stages  # noqa: E402, F401 - the areas' built-in stages
from kiln.platform.artifact import Artifact
from kiln.platform.config import load_config
from kiln.platform.errors import KilnError
from kiln.platform.pipeline import Pipeline, RunResult
from kiln.platform.registry import register_stage, stage_class
from kiln.platform.runtime import Resources, Runtime
from kiln.platform.spec import load_pipeline
from kiln.platform.stage import Stage, StageConfig, StageContext, Step
from kiln.platform.version import __version__

__all__ = [
    "Artifact",
    "KilnError",
    "Pipeline",
    "Resources",
    "RunResult",
    "Runtime",
    "Stage",
    "StageConfig",
    "StageContext",
    "Step",
    "__version__",
    "load_config",
    "load_pipeline",
    "register_stage",
    "stage_class",
]
