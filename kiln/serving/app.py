"""The REST endpoint as a Ray Serve application: one FastAPI ingress deployment whose replicas
hold a backend (the model itself, or a client of a Triton server).

    settings = AppSettings(model_dir="runs/.../export/hf", api_key="s3cret")
    url = deploy(settings, port=8000)           # http://127.0.0.1:8000
    ...
    undeploy()                                   # or serve.shutdown()
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray import serve

from kiln.engine.lora_config import LoRAServingConfig
from kiln.model.quantize import QuantMethod
from kiln.serving.api.protocol import Limits
from kiln.serving.api.server import create_api
from kiln.serving.backends.backend import BatchingConfig
from kiln.serving.backends.local import LocalBackend
from kiln.serving.backends.triton import TritonBackend

log = logging.getLogger("kiln")

DEFAULT_APP_NAME = "kiln"


class AutoscalingOptions(BaseModel):
    """Ray Serve's autoscaling_config: replicas follow the ongoing requests per replica."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=0, description="fewest replicas (0: scale to zero)")
    max_replicas: int = Field(1, ge=1, description="most replicas")
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="ongoing requests per replica the autoscaler aims for"
    )
    initial_replicas: int | None = Field(None, ge=0, description="replicas at start")
    upscale_delay_s: float = Field(30.0, ge=0, description="load must last this long to add")
    downscale_delay_s: float = Field(600.0, ge=0, description="idle this long to remove")

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingOptions:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas "
                f"({self.max_replicas})"
            )
        start = self.initial_replicas
        if start is not None and not self.min_replicas <= start <= self.max_replicas:
            raise ValueError("autoscaling.initial_replicas must lie in min_replicas..max_replicas")
        return self


class DeploymentOptions(BaseModel):
    """Ray Serve deployment settings, passed through."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(1, ge=1, description="fixed replica count (ignored with autoscaling)")
    autoscaling: AutoscalingOptions | None = Field(
        None, description="autoscale between min_replicas and max_replicas instead"
    )
    num_cpus: float = Field(1.0, gt=0, description="CPUs per replica (torch threads follow)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per replica")
    max_ongoing_requests: int = Field(
        256,
        ge=1,
        description="requests a replica works on at once; must exceed max_batch_size to fill "
        "batches (the rest wait in the engine's queue, not Ray Serve's)",
    )


class AppSettings(BaseModel):
    """What one endpoint serves and how."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "triton"] = "local"
    model_dir: str | None = Field(
        None, description="exported Hugging Face model dir (local backend)"
    )
    triton_url: str | None = Field(
        None, description="Triton gRPC address host:port (triton backend)"
    )
    triton_model: str | None = Field(None, description="model name in the Triton repository")
    model_name: str | None = Field(None, description="name clients use; default: the model's own")
    api_key: str | None = Field(None, description="require 'Authorization: Bearer <api_key>'")
    limits: Limits = Field(default_factory=Limits)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="local backend: the weights' and KV cache's dtype; bfloat16 on a CPU with "
        "AMX or AVX-512-BF16 multiplies through weights packed for them",
    )
    quantize: QuantMethod | None = Field(
        None,
        description="local backend: quantize the weights after loading (int8, int4: CPU; fp8: "
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
        description="local backend: serve PEFT LoRA adapters over the model, chosen per request "
        "by `model` (and POST /v1/load_lora_adapter)",
    )
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)

    @model_validator(mode="after")
    def _backend_inputs(self) -> AppSettings:
        if self.backend == "local" and not self.model_dir:
            raise ValueError("backend 'local' needs model_dir")
        if self.backend == "triton" and not (self.triton_url and self.triton_model):
            raise ValueError("backend 'triton' needs triton_url and triton_model")
        if self.backend == "triton" and self.quantize:
            raise ValueError(
                "quantize applies to the local backend; a Triton model is quantized by its "
                "export (export.triton.quantize)"
            )
        if self.backend == "triton" and self.dtype != "float32":
            raise ValueError(
                "dtype applies to the local backend; a Triton model's dtype is its export's "
                "(export.dtype)"
            )
        if self.backend == "triton" and self.lora is not None:
            raise ValueError("lora applies to the local backend")
        if self.quantize == "fp8" and not self.deployment.num_gpus:
            raise ValueError("quantize fp8 runs on a GPU: give the replicas deployment.num_gpus")
        return self


def make_backend(settings: AppSettings):
    if settings.backend == "local":
        return LocalBackend(
            settings.model_dir,  # type: ignore[arg-type]
            settings.model_name,
            settings.batching,
            dtype=settings.dtype,
            quantize=settings.quantize,
            quantize_group_size=settings.quantize_group_size,
            cpu_compile=settings.cpu_compile,
            lora=settings.lora,
        )

    return TritonBackend(settings.triton_url, settings.triton_model, settings.model_name)  # type: ignore[arg-type]


@serve.deployment(name="KilnServer")
@serve.ingress()
class KilnServer:
    """One replica: the backend plus the FastAPI routes over it (built at replica start)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = AppSettings.model_validate(settings)
        self.backend = make_backend(self.settings)

    def __serve_build_asgi_app__(self):
        return create_api(self.backend, self.settings.limits, self.settings.api_key)

    async def __del__(self):
        await self.backend.close()


def build_app(settings: AppSettings):
    """The Ray Serve application (bind only; `deploy` runs it)."""
    opts = settings.deployment
    options: dict[str, Any] = {
        "max_ongoing_requests": opts.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus},
    }
    if opts.autoscaling:
        options["autoscaling_config"] = opts.autoscaling.model_dump(exclude_none=True)
    else:
        options["num_replicas"] = opts.num_replicas
    return KilnServer.options(**options).bind(settings.model_dump(mode="json"))


def start_http(host: str = "127.0.0.1", port: int = 8000) -> str:
    """Start Serve's HTTP proxy (once per Ray cluster) and return its base URL. If Serve already
    runs, its address is kept (Ray allows one per cluster) and that one is returned."""
    from ray.serve.context import _get_global_client

    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
    cfg = _get_global_client().http_config
    if (cfg.host, cfg.port) != (host, port):
        log.warning("Ray Serve already listens on %s:%s; using that address", cfg.host, cfg.port)
    shown = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{shown}:{cfg.port}"


def deploy(
    settings: AppSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = DEFAULT_APP_NAME,
    route_prefix: str = "/",
) -> str:
    """Run the app on Ray Serve (Ray must be initialised) and return the endpoint's base URL."""
    base = start_http(host, port)
    serve.run(build_app(settings), name=name, route_prefix=route_prefix)
    return base + ("" if route_prefix == "/" else route_prefix)


def undeploy(name: str = DEFAULT_APP_NAME) -> None:
    serve.delete(name)


def app_builder(args: dict[str, Any]):
    """Ray Serve application builder: `serve run kiln.serving.app:app_builder model_dir=DIR`, and
    the `import_path` of the KubeRay RayService in deploy/ (its `args:` are AppSettings fields)."""
    return build_app(AppSettings.model_validate(args))
