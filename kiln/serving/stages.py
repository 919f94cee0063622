"""The `serve` stage: an ExportedModel in, a live REST endpoint (an Endpoint artifact) out.

    - name: serve
      type: serve
      inputs: {model: export.model}
      config: {backend: local, port: 8000, api_key_env: KILN_API_KEY, blocking: true}

The Endpoint artifact's `artifact.json` meta holds the URL (`meta.url`, `meta.openai_base_url`).
Lifetime: with `blocking: false` (the default) the stage returns once the app is ready and the
app keeps running in the pipeline's Ray: until the Python process that ran the pipeline exits
(embedded Ray; from Python, `Pipeline.run(..., shutdown=False)` keeps it up), or, on a Ray
cluster (`RAY_ADDRESS`), until it is deleted (`serve.delete(app_name)` / `serve shutdown`).
With `blocking: true` the stage serves until Ctrl-C / SIGTERM, then takes the app down; use
it for `kiln run` of a pipeline that ends in `serve`. The stage is never cached: an endpoint
is a running process, not a file.
"""

from __future__ import annotations

import os
from typing import ClassVar, Literal

from pydantic import Field

from kiln.engine.lora_config import LoRAServingConfig
from kiln.model.quantize import QuantMethod
from kiln.platform.errors import ConfigError
from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.serving.api.protocol import Limits
from kiln.serving.app import DeploymentOptions
from kiln.serving.backends.backend import BatchingConfig
from kiln.serving.export.stages import ExportStage
from kiln.serving.launch import launch

# the area's stages, those of its sub-packages too (kiln/stages.py names them here)
__all__ = ["ExportStage", "ServeStage"]


class ServeConfig(StageConfig):
    backend: Literal["local", "triton"] = Field(
        "local", description="model in the replica, or in Triton"
    )
    host: str = Field("127.0.0.1", description="HTTP bind address (0.0.0.0 to expose)")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of Ray Serve's proxy.")
    app_name: str = Field("kiln", description="Ray Serve application name")
    route_prefix: str = Field(
        "/", pattern=r"^/", description="URL prefix the application is served under."
    )
    model_name: str | None = Field(None, description="name clients use (default: the model's)")
    api_key: str | None = Field(None, description="require 'Authorization: Bearer <key>'")
    api_key_env: str | None = Field(None, description="read the API key from this env variable")
    triton_url: str | None = Field(
        None, description="existing Triton gRPC host:port (else one is started)"
    )
    triton_model: str | None = Field(None, description="model name in the Triton repository")
    limits: Limits = Field(
        default_factory=Limits, description="Per-request limits (max_new_tokens, prompt length)."
    )
    batching: BatchingConfig = Field(
        default_factory=BatchingConfig,
        description="Request batching inside a replica (local backend).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="local backend: the weights' and KV cache's dtype; bfloat16 on a CPU with "
        "AMX or AVX-512-BF16 multiplies through weights packed for them",
    )
    quantize: QuantMethod | None = Field(
        None,
        description="local backend: weights quantized after loading (int8, int4 on CPU; fp8 on "
        "CUDA GPUs of capability 8.9+)",
    )
    quantize_group_size: Literal[32, 64, 128, 256] = Field(
        32, description="int4: inputs that share one scale"
    )
    cpu_compile: bool = Field(
        True,
        description="local backend, bfloat16 on a CPU with AMX or AVX-512-BF16: compile the "
        "RMSNorms with torch.compile (inductor) at load, 5-20 s once; eager where there is no "
        "C++ compiler",
    )
    lora: LoRAServingConfig | None = Field(
        None,
        description="local backend: PEFT LoRA adapters served over the model ({adapters: {name: "
        "path}, max_loras, max_lora_rank}), chosen per request by `model`",
    )
    deployment: DeploymentOptions = Field(
        default_factory=DeploymentOptions,
        description="Replicas, autoscaling and resources of the Ray Serve deployment.",
    )
    blocking: bool = Field(False, description="serve until Ctrl-C instead of returning when ready")


class ServeStage(Stage):
    """Serve an ExportedModel over REST (OpenAI, KServe v2) on Ray Serve; later stages call it."""

    type_name = "serve"
    Config = ServeConfig
    input_kinds: ClassVar[dict[str, str]] = {"model": "ExportedModel"}
    output_kinds: ClassVar[dict[str, str]] = {"endpoint": "Endpoint"}
    cacheable: ClassVar[bool] = False
    resources: ClassVar[Resources] = Resources(ray=True)  # the endpoint is a Ray Serve app

    def api_key(self) -> str | None:
        cfg: ServeConfig = self.config  # type: ignore[assignment]
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ConfigError(
                    f"{self.name}.api_key_env: environment variable {cfg.api_key_env} is not set"
                )
            return key
        return cfg.api_key

    def run(self, ctx: StageContext) -> dict:
        cfg: ServeConfig = self.config  # type: ignore[assignment]
        ctx.ray()
        settings = cfg.model_dump(
            include={
                "backend",
                "model_name",
                "triton_url",
                "triton_model",
                "limits",
                "batching",
                "dtype",
                "quantize",
                "quantize_group_size",
                "cpu_compile",
                "lora",
                "deployment",
            }
        )
        settings["api_key"] = self.api_key()
        endpoint = launch(
            ctx.inputs["model"].path,
            settings,
            host=cfg.host,
            port=cfg.port,
            app_name=cfg.app_name,
            route_prefix=cfg.route_prefix,
        )
        out = ctx.outputs["endpoint"]
        out.meta = endpoint.meta
        with open(os.path.join(out.path, "endpoint.url"), "w") as f:
            f.write(endpoint.url + "\n")
        # the launch logged "endpoint <url> serves <model>": the terminal's one line for it
        if cfg.blocking:
            ctx.log.info("serving until Ctrl-C")
            endpoint.wait()
        return {"url": endpoint.url, "model": endpoint.model_name}
