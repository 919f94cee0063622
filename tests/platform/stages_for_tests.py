"""Stages used by the platform tests (named in specs as tests.platform.stages_for_tests:Name)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext


class CountConfig(StageConfig):
    log: str
    value: int = 1


class CountRuns(Stage):
    """Appends a line to `log` each time it really runs; outputs a Stats artifact."""

    type_name = "test.count"
    Config = CountConfig
    output_kinds: ClassVar[dict[str, str]] = {"out": "Stats"}

    def run(self, ctx: StageContext):
        with open(self.config.log, "a") as f:
            f.write(f"{self.name}\n")
        (Path(ctx.outputs["out"].path) / "value.txt").write_text(str(self.config.value))
        ctx.outputs["out"].counts = {"value": self.config.value}
        return {"value": self.config.value}


class HangConfig(StageConfig):
    marker: str
    log: str


class HangOnce(Stage):
    """The first time: writes `marker` and hangs (the test kills the process). Later: finishes."""

    type_name = "test.hang"
    Config = HangConfig
    input_kinds: ClassVar[dict[str, str]] = {"inp": "Stats"}
    output_kinds: ClassVar[dict[str, str]] = {"out": "Stats"}

    def run(self, ctx: StageContext):
        with open(self.config.log, "a") as f:
            f.write(f"{self.name}\n")
        marker = Path(self.config.marker)
        if not marker.exists():
            marker.write_text("started")
            time.sleep(300)
        (Path(ctx.outputs["out"].path) / "done.txt").write_text("ok")
        return {}


class ProbeConfig(StageConfig):
    needs_ray: bool | None = None
    gpus: float = 0


class RayProbe(Stage):
    """Declares `needs_ray`/`gpus`; reports whether Ray is up while it runs and its CPUs."""

    type_name = "test.ray_probe"
    Config = ProbeConfig
    output_kinds: ClassVar[dict[str, str]] = {"out": "Stats"}

    def needs(self) -> Resources:
        return Resources(ray=self.config.needs_ray, gpus=self.config.gpus)

    def run(self, ctx: StageContext):
        import ray

        up = ray.is_initialized()
        return {"ray_up": up, "cpus": ray.cluster_resources().get("CPU") if up else None}


class HeldRayProbe(RayProbe):
    """Like an endpoint: its effect lives on Ray, so it is never cached and keeps Ray up."""

    type_name = "test.held_ray_probe"
    cacheable: ClassVar[bool] = False
