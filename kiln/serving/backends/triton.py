"""The triton backend: a Triton server with kiln's exported python-backend model, over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Literal

from kiln.serving.api.protocol import RequestError
from kiln.serving.backends.backend import Job, Prompt, Result
from kiln.serving.chat_template import triton_chat_config

if TYPE_CHECKING:
    from kiln.engine.logprobs import TokenScore
    from kiln.engine.sampler import SamplingParams

LOCAL_ONLY = "needs the local backend (the triton backend sends text and receives text)"
UNAVAILABLE = "the Triton server is unavailable (restarting?): retry after the Retry-After delay"
GRPC_CORE_INTERNAL = "Internal error from Core"
# gRPC retries a lost connection at most this far apart (its default grows to 120 s): a
# restarted server is found within ~1 s of listening again
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _is_unavailable(e: BaseException) -> bool:
    """A refused or dropped connection (the server is down or restarting), not a verdict on
    the request."""
    import grpc
    from tritonclient.utils import InferenceServerException

    if isinstance(e, InferenceServerException):
        status, details = e.status(), e.message()
    elif isinstance(e, grpc.aio.AioRpcError):  # a gRPC stream's responses come unwrapped
        status, details = str(e.code()), e.details()
    else:
        return isinstance(e, OSError)
    # gRPC core's own INTERNAL: the connection broke while a request was being sent (Triton
    # reports its own errors inside the response, with its message)
    return status == "StatusCode.UNAVAILABLE" or (
        status == "StatusCode.INTERNAL" and details == GRPC_CORE_INTERNAL
    )


@contextlib.contextmanager
def _unavailable_is_503() -> Iterator[None]:
    """A Triton server that is down answers 503 (+ Retry-After): clients retry, not fail."""
    try:
        yield
    except Exception as e:
        if _is_unavailable(e):
            raise RequestError(UNAVAILABLE, status=503) from e
        raise


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
        self.context_length: int | None = None  # Triton's model does not say
        self._chat: tuple[str | None, dict[str, str]] | None = None  # from the model config
        self.eos_token_ids: set[int] = set()

    async def prepare(
        self, prompt: Prompt, params: SamplingParams, *, truncate: int | None, fit_context: bool
    ) -> Job:
        """Text and sampling fields are all Triton's model takes: refuse the rest (400)."""
        if not isinstance(prompt, str):
            raise RequestError(f"token-id prompts {LOCAL_ONLY}", param="prompt")
        if truncate is not None:
            raise RequestError(
                f"truncate_prompt_tokens {LOCAL_ONLY}", param="truncate_prompt_tokens"
            )
        if params.penalized:
            raise RequestError(f"penalties {LOCAL_ONLY}", param="presence_penalty")
        if params.grammar is not None:
            raise RequestError(f"structured output {LOCAL_ONLY}", param=params.grammar.field)
        return Job(prompt, params)

    async def score(self, ids: list[int], top: int) -> list[TokenScore]:
        raise RequestError(f"logprobs {LOCAL_ONLY}", param="logprobs")

    def token_texts(self, ids: list[int]) -> list[str]:
        raise RequestError(f"logprobs {LOCAL_ONLY}", param="logprobs")

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        raise RequestError(f"logprobs {LOCAL_ONLY}", param="logprobs")

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (kiln's Triton export puts it in the model config)."""
        return self._chat_config()[0]

    @property
    def special_tokens(self) -> dict[str, str]:
        return self._chat_config()[1]

    def _chat_config(self) -> tuple[str | None, dict[str, str]]:
        # chat renders before any request reaches Triton: one blocking config read, once
        if self._chat is None:
            import tritonclient.grpc as grpcclient
            from tritonclient.utils import InferenceServerException

            try:
                with grpcclient.InferenceServerClient(self.url) as client:
                    config = client.get_model_config(self.triton_model, as_json=True)
            except (InferenceServerException, OSError) as e:
                if _is_unavailable(e):  # down: 503 now, read it when it is back
                    raise RequestError(UNAVAILABLE, status=503) from e
                return None, {}
            self._chat = triton_chat_config(config["config"])
        return self._chat

    async def _setup(self):
        if self._client is None:
            import tritonclient.grpc.aio as grpcclient
            from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE

            options = [  # tritonclient's defaults (channel_args replaces them) + reconnects
                ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
                ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
                *RECONNECT_OPTIONS,
            ]
            self._client = grpcclient.InferenceServerClient(self.url, channel_args=options)
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
            self._chat = triton_chat_config(config)
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

        with _unavailable_is_503():
            async for res, error in client.stream_infer(requests()):
                if error is not None:
                    if _is_unavailable(error):
                        raise RequestError(UNAVAILABLE, status=503) from error
                    raise RuntimeError(f"triton: {error}")
                yield res

    async def _one(self, prompt: str, params: SamplingParams) -> Result:
        with _unavailable_is_503():
            client = await self._setup()
            if self._decoupled:
                results = [
                    self._result(r) async for r in self._responses(prompt, params, stream=False)
                ]
                return results[-1]
            return self._result(
                await client.infer(self.triton_model, self._tensors(prompt, params))
            )

    async def complete(self, jobs: list[Job]) -> list[Result]:
        return list(await asyncio.gather(*(self._one(j.prompt, j.params) for j in jobs)))

    async def stream(self, job: Job) -> AsyncIterator[str]:
        with _unavailable_is_503():
            await self._setup()
        if not self._decoupled:  # a plain model answers whole completions: one delta
            (result,) = await self.complete([job])
            job.finish_reason = result.finish_reason
            job.completion_tokens = result.completion_tokens
            yield result.text
            return
        async for res in self._responses(job.prompt, job.params, stream=True):
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
