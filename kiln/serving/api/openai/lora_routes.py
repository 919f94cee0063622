"""vLLM's runtime LoRA routes: `POST /v1/load_lora_adapter` {"lora_name", "lora_path"} serves a
PEFT adapter folder under a new `model` name from the next request on; `POST
/v1/unload_lora_adapter` {"lora_name"} stops serving it (requests already running finish with
it). Answers as vLLM's: 200 with a one-line text; 400 for a bad folder or a taken name, 404 for
an unknown name, each a one-line OpenAI error naming the field.

Each replica holds its own adapters: with several replicas a load reaches the one replica that
answers it, so a multi-replica deployment names its adapters at start (`lora.adapters`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from kiln.serving.api.params import backend_of
from kiln.serving.api.protocol import RequestError

router = APIRouter(prefix="/v1")


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: StrictStr = Field(min_length=1, max_length=256)
    lora_path: StrictStr = Field(min_length=1)


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: StrictStr = Field(min_length=1, max_length=256)
    lora_int_id: StrictInt | None = None  # vLLM's; names are what kiln goes by


def _lora_backend(request: Request):
    backend = backend_of(request)
    if not hasattr(backend, "load_lora"):
        raise RequestError("this backend serves no LoRA adapters (the local backend does)")
    return backend


@router.post("/load_lora_adapter")
async def load_lora_adapter(req: LoadLoRAAdapterRequest, request: Request):
    await _lora_backend(request).load_lora(req.lora_name, req.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(req: UnloadLoRAAdapterRequest, request: Request):
    await _lora_backend(request).unload_lora(req.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
