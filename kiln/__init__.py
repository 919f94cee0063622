"""Kiln: raw text to a served language model, on Ray.

The SDK: compose stages into a pipeline and run it.

    from kiln import Pipeline, stage_class
    Pipeline("demo", [stage_class("text.read")(paths=["docs/"]), stage_class("text.stats")()]).run()
"""

__version__ = "0.1.0"

from kiln.platform.artifact import Artifact  # noqa: E402
from kiln.platform.errors import KilnError  # noqa: E402
from kiln.platform.pipeline import Pipeline, RunResult  # noqa: E402
from kiln.platform.registry import register_stage, stage_class  # noqa: E402
from kiln.platform.runtime import Runtime  # noqa: E402
from kiln.platform.spec import load_pipeline  # noqa: E402
from kiln.platform.stage import Stage, StageConfig, StageContext  # noqa: E402

__all__ = [
    "Artifact",
    "KilnError",
    "Pipeline",
    "RunResult",
    "Runtime",
    "load_pipeline",
    "Stage",
    "StageConfig",
    "StageContext",
    "register_stage",
    "stage_class",
    "__version__",
]
