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

    async def close(self) -> None: ...


# ---------------------------------------------------------------------------------- local


class LocalBackend:
    """The kiln `Generator` in this process. Each prompt is queued on its own; `@serve.batch`
    gathers concurrent prompts (from any requests) into one batched, KV-cached `generate`."""

    def __init__(self, model_dir: str, model_name: str | None = None, batching: BatchingConfig | None = None):
        from kiln.serving.generate import Generator

        self.generator = Generator.load(model_dir)
        self.model_name = model_name or self.generator.model_name
        batching = batching or BatchingConfig()
        self._generate_one.set_max_batch_size(batching.max_batch_size)
        self._generate_one.set_batch_wait_timeout_s(batching.batch_wait_timeout_s)
        # one model, one forward at a time: a stream and a batch never interleave in torch
        self._lock = threading.Lock()

    async def complete(self, prompts: list[str], params: SamplingParams) -> list[Result]:
        return list(await asyncio.gather(*(self._generate_one((p, params)) for p in prompts)))

    async def _run(self, prompts: list[str], params: SamplingParams):
        def work():
            with self._lock:
                return self.generator.generate(prompts, params)

        # a worker thread keeps the event loop (health checks, queueing) responsive
        return await asyncio.to_thread(work)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _generate_one(self, items: list[tuple[str, SamplingParams]]) -> list[Result]:
        # one generate() per distinct set of sampling parameters in the batch
        groups: dict[str, list[int]] = {}
        for i, (_, params) in enumerate(items):
            groups.setdefault(params.model_dump_json(), []).append(i)
        results: list[Result | None] = [None] * len(items)
        for idx in groups.values():
            outs = await self._run([items[i][0] for i in idx], items[idx[0]][1])
            for i, c in zip(idx, outs):
                results[i] = Result(c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens)
        return results  # type: ignore[return-value]

    async def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[str]:
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

    async def close(self) -> None:
        pass


# --------------------------------------------------------------------------------- triton


class TritonBackend:
    """A Triton server with kiln's exported python-backend model (vLLM's convention: BYTES
    `text_input` -> `text_output`, sampling fields as a JSON `sampling_parameters` input or as
    individual inputs). Concurrent requests are sent as they come: Triton batches them itself."""

    def __init__(self, url: str, triton_model: str, model_name: str | None = None):
        self.url = url.removeprefix("grpc://")
        self.triton_model = triton_model
        self.model_name = model_name or triton_model
        self._client = None
        self._inputs: dict[str, str] | None = None  # input name -> datatype
        self._outputs: set[str] = set()
        self._batched = False

    async def _setup(self):
        if self._client is None:
            import tritonclient.grpc.aio as grpcclient

            self._client = grpcclient.InferenceServerClient(self.url)
        if self._inputs is None:
            meta = await self._client.get_model_metadata(self.triton_model, as_json=True)
            config = await self._client.get_model_config(self.triton_model, as_json=True)
            self._inputs = {t["name"]: t["datatype"] for t in meta["inputs"]}
            self._outputs = {t["name"] for t in meta["outputs"]}
            self._batched = int(config.get("config", {}).get("max_batch_size", 0)) > 0
        return self._client

    def _tensors(self, prompt: str, params: SamplingParams):
        import numpy as np
        import tritonclient.grpc.aio as grpcclient

        assert self._inputs is not None
        lead = [1] if self._batched else []
        tensors = []

        def add(name: str, value, dtype):
            arr = np.array(value, dtype=dtype).reshape(lead + [1])
            t = grpcclient.InferInput(name, list(arr.shape), self._inputs[name])
            t.set_data_from_numpy(arr)
            tensors.append(t)

        add("text_input", [prompt.encode()], np.object_)
        fields = {
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            fields["seed"] = params.seed
        if params.stop:
            fields["stop"] = params.stop
        if "sampling_parameters" in self._inputs:
            add("sampling_parameters", [json.dumps(fields).encode()], np.object_)
        else:
            np_types = {"INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "FP64": np.float64}
            for name, value in fields.items():
                if name in self._inputs and self._inputs[name] in np_types:
                    add(name, [value], np_types[self._inputs[name]])
        for name, value in (("stream", False), ("exclude_input_in_output", True)):
            if name in self._inputs and self._inputs[name] == "BOOL":
                add(name, [value], np.bool_)
        return tensors

    async def _one(self, prompt: str, params: SamplingParams) -> Result:
        client = await self._setup()
        res = await client.infer(self.triton_model, self._tensors(prompt, params))
        text = res.as_numpy("text_output").reshape(-1)[0]
        text = text.decode() if isinstance(text, bytes) else str(text)
        finish: Literal["stop", "length"] = "length"
        if "finish_reason" in self._outputs:
            reason = res.as_numpy("finish_reason").reshape(-1)[0]
            finish = "stop" if (reason.decode() if isinstance(reason, bytes) else reason) == "stop" else "length"
        counts = {}
        for name in ("prompt_tokens", "completion_tokens"):
            if name in self._outputs:
                counts[name] = int(res.as_numpy(name).reshape(-1)[0])
        return Result(text, finish, counts.get("prompt_tokens"), counts.get("completion_tokens"))

    async def complete(self, prompts: list[str], params: SamplingParams) -> list[Result]:
        return list(await asyncio.gather(*(self._one(p, params) for p in prompts)))

    async def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[str]:
        # the exported model answers whole completions: one delta
        (result,) = await self.complete([prompt], params)
        yield result.text

    async def ready(self) -> bool:
        try:
            client = await self._setup()
            return bool(await client.is_model_ready(self.triton_model))
        except Exception:
            return False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
