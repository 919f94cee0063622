"""Where the model runs behind the REST app: inside the Serve replica (`local`) or in a Triton
server reached over gRPC (`triton`). Both speak one small async interface, `Backend`."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from kiln.platform.errors import KilnError
from kiln.serving.protocol import RequestError

if TYPE_CHECKING:
    from kiln.serving.sampling import SamplingParams


@dataclass
class Result:
    """One finished completion, whichever backend made it (token counts None when unknown)."""

    text: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class BatchingConfig(BaseModel):
    """Ray Serve dynamic batching (`@serve.batch`) of single prompts into one `generate` call."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(8, ge=1, description="prompts per generate() call (1: no batching)")
    batch_wait_timeout_s: float = Field(0.01, ge=0.0, description="wait this long to fill a batch")


class Backend(Protocol):
    model_name: str

    async def complete(self, prompts: list[str], params: SamplingParams) -> list[Result]: ...

    def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[str]: ...

    async def ready(self) -> bool: ...

    def stats(self) -> dict[str, int]: ...

    async def close(self) -> None: ...


# ---------------------------------------------------------------------------------- local


class LocalBackend:
    """The kiln `Generator` in this process. Each prompt is queued on its own; `@serve.batch`
    gathers concurrent prompts (from any requests) into one batched, KV-cached `generate`."""

    def __init__(
        self, model_dir: str, model_name: str | None = None, batching: BatchingConfig | None = None
    ):
        from kiln.serving.generate import Generator

        self.generator = Generator.load(model_dir)
        self.model_name = model_name or self.generator.model_name
        batching = batching or BatchingConfig()
        self._generate_one.set_max_batch_size(batching.max_batch_size)
        self._generate_one.set_batch_wait_timeout_s(batching.batch_wait_timeout_s)
        # one model, one forward at a time: a stream and a batch never interleave in torch
        self._lock = threading.Lock()
        self._inferences = 0  # prompts completed
        self._executions = 0  # generate() calls (batches)

    async def complete(self, prompts: list[str], params: SamplingParams) -> list[Result]:
        for p in prompts:
            self._check_prompt(p)
        return list(await asyncio.gather(*(self._generate_one((p, params)) for p in prompts)))

    def _check_prompt(self, prompt: str) -> None:
        """Reject what `generate` would fail on before it joins a batch (and fails the batch)."""
        try:
            n = len(self.generator.encode(prompt))
        except KilnError as e:
            raise RequestError(str(e), param="prompt") from None
        if n >= self.generator.max_seq_len:
            raise RequestError(
                f"prompt has {n} tokens; the model's context is {self.generator.max_seq_len}",
                param="prompt",
            )

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _generate_one(self, items: list[tuple[str, SamplingParams]]) -> list[Result]:
        prompts = [p for p, _ in items]
        params = [q for _, q in items]  # per-prompt parameters, one KV-cached batch

        def work():
            with self._lock:
                return self.generator.generate(prompts, params)

        # a worker thread keeps the event loop (health checks, queueing) responsive
        outs = await asyncio.to_thread(work)
        self._inferences += len(items)
        self._executions += 1
        return [Result(c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens) for c in outs]

    async def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[str]:
        self._check_prompt(prompt)
        it = self.generator.stream(prompt, params)
        done = object()

        def step():
            with self._lock:
                return next(it, done)

        while True:
            delta = await asyncio.to_thread(step)
            if delta is done:
                return
            yield delta

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {"inference_count": self._inferences, "execution_count": self._executions}

    async def close(self) -> None:
        pass


# --------------------------------------------------------------------------------- triton


class TritonBackend:
    """A Triton server with kiln's exported python-backend model (vLLM's convention: BYTES
    `text_input` -> `text_output`, sampling fields as individual inputs or as a JSON
    `sampling_parameters` input). Concurrent requests are sent as they come: Triton batches them.
    A decoupled model is driven over a gRPC stream (and streams text deltas)."""

    def __init__(self, url: str, triton_model: str, model_name: str | None = None):
        self.url = url.removeprefix("grpc://")
        self.triton_model = triton_model
        self.model_name = model_name or triton_model
        self._client = None
        self._inputs: dict[str, str] | None = None  # input name -> datatype
        self._outputs: set[str] = set()
        self._batched = False
        self._decoupled = False

    async def _setup(self):
        if self._client is None:
            import tritonclient.grpc.aio as grpcclient

            self._client = grpcclient.InferenceServerClient(self.url)
        if self._inputs is None:
            meta = await self._client.get_model_metadata(self.triton_model, as_json=True)
            config = (await self._client.get_model_config(self.triton_model, as_json=True))[
                "config"
            ]
            self._outputs = {t["name"] for t in meta["outputs"]}
            self._batched = int(config.get("max_batch_size", 0)) > 0
            self._decoupled = bool(
                config.get("model_transaction_policy", {}).get("decoupled", False)
            )
            self._inputs = {t["name"]: t["datatype"] for t in meta["inputs"]}
        return self._client

    def _tensors(self, prompt: str, params: SamplingParams, stream: bool = False):
        import numpy as np
        import tritonclient.grpc.aio as grpcclient

        assert self._inputs is not None
        lead = [1] if self._batched else []
        tensors = []

        def add(name: str, values: list, dtype) -> None:
            arr = np.array(values, dtype=dtype).reshape(lead + [len(values)])
            t = grpcclient.InferInput(name, list(arr.shape), self._inputs[name])
            t.set_data_from_numpy(arr)
            tensors.append(t)

        add("text_input", [prompt.encode()], np.object_)
        fields: dict = {
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            fields["seed"] = params.seed
        if "sampling_parameters" in self._inputs:
            add(
                "sampling_parameters",
                [json.dumps({**fields, "stop": params.stop}).encode()],
                np.object_,
            )
        else:
            np_types = {
                "INT32": np.int32,
                "INT64": np.int64,
                "FP32": np.float32,
                "FP64": np.float64,
            }
            for name, value in fields.items():
                if self._inputs.get(name) in np_types:
                    add(name, [value], np_types[self._inputs[name]])
            if params.stop and self._inputs.get("stop") == "BYTES":
                add("stop", [s.encode() for s in params.stop], np.object_)
        for name, value in (("stream", stream), ("exclude_input_in_output", True)):
            if self._inputs.get(name) == "BOOL":
                add(name, [value], np.bool_)
        return tensors

    def _result(self, res) -> Result:
        def first(name: str):
            v = res.as_numpy(name).reshape(-1)[0]
            return v.decode() if isinstance(v, bytes) else v

        finish: Literal["stop", "length"] = "length"
        if "finish_reason" in self._outputs and res.as_numpy("finish_reason") is not None:
            finish = "stop" if first("finish_reason") == "stop" else "length"
        counts = {}
        for name in ("prompt_tokens", "completion_tokens"):
            if name in self._outputs and res.as_numpy(name) is not None:
                counts[name] = int(first(name))
        return Result(
            str(first("text_output")),
            finish,
            counts.get("prompt_tokens"),
            counts.get("completion_tokens"),
        )

    async def _responses(self, prompt: str, params: SamplingParams, stream: bool):
        """Responses of a decoupled model for one request, over a gRPC stream."""
        client = await self._setup()

        async def requests():
            yield {"model_name": self.triton_model, "inputs": self._tensors(prompt, params, stream)}

        async for res, error in client.stream_infer(requests()):
            if error is not None:
                raise RuntimeError(f"triton: {error}")
            yield res

    async def _one(self, prompt: str, params: SamplingParams) -> Result:
        client = await self._setup()
        if self._decoupled:
            results = [self._result(r) async for r in self._responses(prompt, params, stream=False)]
            return results[-1]
        return self._result(await client.infer(self.triton_model, self._tensors(prompt, params)))

    async def complete(self, prompts: list[str], params: SamplingParams) -> list[Result]:
        return list(await asyncio.gather(*(self._one(p, params) for p in prompts)))

    async def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[str]:
        await self._setup()
        if not self._decoupled:  # a plain model answers whole completions: one delta
            (result,) = await self.complete([prompt], params)
            yield result.text
            return
        async for res in self._responses(prompt, params, stream=True):
            text = res.as_numpy("text_output")
            if text is not None:
                v = text.reshape(-1)[0]
                yield v.decode() if isinstance(v, bytes) else str(v)

    async def ready(self) -> bool:
        from tritonclient.utils import InferenceServerException

        try:
            client = await self._setup()
            return bool(await client.is_model_ready(self.triton_model))
        except (InferenceServerException, OSError):
            return False

    def stats(self) -> dict[str, int]:
        return {}  # Triton keeps its own: GET /v2/models/<m>/stats on the Triton server

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
