"""Bring an endpoint up for an exported model: find its Hugging Face dir or Triton repository,
start a Triton server when the triton backend has none to talk to, deploy the Serve app.
Shared by the `serve` stage, `kiln serve` and the serving benchmark."""

from __future__ import annotations

import atexit
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kiln.model.formats.hf import find_hf_dir
from kiln.platform.errors import ConfigError, InputError, format_validation_error
from kiln.serving.app import DEFAULT_APP_NAME, AppSettings, deploy
from kiln.serving.triton.server import TritonServer

log = logging.getLogger("kiln")

# app name -> the endpoint this process launched (so Python callers can stop one by name)
RUNNING: dict[str, Endpoint] = {}


def find_triton_repo(model_dir: str, model: str | None = None) -> tuple[str, str]:
    """(repository dir, model name) of an ExportedModel's Triton repository (`<dir>/triton`)."""
    for repo in (os.path.join(model_dir, "triton"), model_dir):
        if not os.path.isdir(repo):
            continue
        models = sorted(
            m for m in os.listdir(repo) if os.path.exists(os.path.join(repo, m, "config.pbtxt"))
        )
        if model and model in models:
            return repo, model
        if not model and len(models) == 1:
            return repo, models[0]
        if models:
            raise InputError(f"{repo}: holds Triton models {models}; name one (triton_model)")
    raise InputError(
        f"{model_dir}: no Triton model repository (a dir of <model>/config.pbtxt) here or in "
        "triton/"
    )


@dataclass
class Endpoint:
    """A deployed app (and the Triton server started for it, if any)."""

    url: str
    model_name: str
    app_name: str
    settings: AppSettings
    triton: Any = None  # a kiln.serving.triton.server.TritonServer we own
    _closed: bool = field(default=False, repr=False)

    @property
    def meta(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "openai_base_url": self.url + "/v1",
            "model": self.model_name,
            "backend": self.settings.backend,
            "app_name": self.app_name,
            "triton_url": self.settings.triton_url,
            "api_key_required": self.settings.api_key is not None,
        }

    def wait(self) -> None:
        """Block until Ctrl-C / SIGTERM, then take the endpoint down."""
        import signal

        def on_term(*_):
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            log.info("stopping endpoint %s", self.url)
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if RUNNING.get(self.app_name) is self:
            del RUNNING[self.app_name]
        import ray
        from ray import serve

        if ray.is_initialized():
            try:
                serve.delete(self.app_name)
            except Exception as e:  # noqa: BLE001 - Serve may already be gone at interpreter exit
                log.debug("serve.delete(%s): %s", self.app_name, e)
        if self.triton is not None:
            self.triton.stop()
            self.triton = None


def launch(
    model_dir: str | None,
    settings: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    app_name: str = DEFAULT_APP_NAME,
    route_prefix: str = "/",
) -> Endpoint:
    """Deploy an endpoint for `model_dir` (an ExportedModel dir or an HF dir). Ray must be up.
    With the triton backend and no `triton_url`, a Triton server is started over the model's
    repository (restarted if it dies); it stops with `Endpoint.close()` or at interpreter exit."""
    settings = dict(settings)
    triton = None
    if settings.get("backend", "local") == "local":
        if settings.get("model_dir") is None:
            if model_dir is None:
                raise InputError("serve: the local backend needs a model directory")
            settings["model_dir"] = os.path.abspath(find_hf_dir(model_dir))
    else:
        if not (settings.get("triton_url") and settings.get("triton_model")):
            if model_dir is None:
                raise InputError(
                    "serve: the triton backend needs a model directory or triton_url + triton_model"
                )
            repo, name = find_triton_repo(model_dir, settings.get("triton_model"))
            settings["triton_model"] = name
            if not settings.get("triton_url"):
                triton = TritonServer(repo, restart=True).start()  # restarted if it dies
                settings["triton_url"] = triton.grpc_url
    try:
        app_settings = AppSettings.model_validate(settings)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "serve")) from None
    try:
        url = deploy(app_settings, host=host, port=port, name=app_name, route_prefix=route_prefix)
    except BaseException:
        if triton is not None:
            triton.stop()
        raise
    name = app_settings.model_name or served_model_name(url, app_settings.api_key)
    endpoint = Endpoint(
        url=url, model_name=name, app_name=app_name, settings=app_settings, triton=triton
    )
    atexit.register(endpoint.close)
    RUNNING[app_name] = endpoint
    log.info("endpoint %s serves %r (%s backend)", url, name, app_settings.backend)
    return endpoint


def stop(app_name: str = DEFAULT_APP_NAME) -> None:
    """Take down an endpoint this process launched (e.g. by a non-blocking serve stage)."""
    endpoint = RUNNING.get(app_name)
    if endpoint is not None:
        endpoint.close()


def served_model_name(url: str, api_key: str | None = None) -> str:
    """The model name the endpoint reports (`GET /v1/models`)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(url + "/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]
