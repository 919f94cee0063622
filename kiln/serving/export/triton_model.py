"""Triton python-backend model for a kiln language model (copied to `<repo>/<model>/1/model.py`).

Inputs follow the vLLM backend's convention: `text_input` (string) plus optional `max_tokens`,
`temperature`, `top_k`, `top_p`, `seed`, `stop` and `stream`; output `text_output` (the
completion, without the prompt) plus `finish_reason`, `prompt_tokens`, `completion_tokens`.
A dynamically batched set of requests is completed as one KV-cached batch. With a decoupled
transaction policy, `stream: true` sends one response per text delta.

Runs in Triton's python stub with torch, safetensors, tokenizers, pydantic and numpy < 2; the
kiln code it needs is vendored next to this file under `runtime/` (no Ray).
"""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "runtime"))

OPTIONAL_INPUTS = {
    "max_tokens": ("max_new_tokens", int),
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "seed": ("seed", int),
}


def _strings(array) -> list:
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from kiln.serving.generate import Generator

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.default_max_tokens = int(params.get("default_max_tokens", "64"))
        self.max_tokens_limit = int(params.get("max_tokens_limit", "4096"))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        if args.get("model_instance_kind") == "GPU" and torch.cuda.is_available():
            device = f"cuda:{args['model_instance_device_id']}"
        else:
            device = "cpu"
        threads = int(params.get("torch_threads", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        dtype = getattr(torch, params.get("dtype", "float32"))
        self.generator = Generator.load(
            os.path.join(HERE, "hf"), device=device, dtype=dtype, model_name=args["model_name"]
        )

    # one request may carry a batch of rows ([batch, 1] tensors)
    def _rows(self, request):
        from kiln.serving.sampling import SamplingParams

        prompts = _strings(pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy())
        fields = [{} for _ in prompts]
        for name, (field, cast) in OPTIONAL_INPUTS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                continue
            values = tensor.as_numpy().reshape(len(prompts), -1)[:, 0]
            for row, value in zip(fields, values, strict=False):
                row[field] = cast(value)
        stop_tensor = pb_utils.get_input_tensor_by_name(request, "stop")
        if stop_tensor is not None:
            stops = stop_tensor.as_numpy().reshape(len(prompts), -1)
            for row, values in zip(fields, stops, strict=False):
                row["stop"] = [s for s in _strings(values) if s]
        stream_tensor = pb_utils.get_input_tensor_by_name(request, "stream")
        stream = (
            bool(stream_tensor.as_numpy().reshape(-1)[0]) if stream_tensor is not None else False
        )
        params = []
        for row in fields:
            row.setdefault("max_new_tokens", self.default_max_tokens)
            if row["max_new_tokens"] > self.max_tokens_limit:
                raise ValueError(
                    f"max_tokens {row['max_new_tokens']} is above the limit {self.max_tokens_limit}"
                )
            params.append(SamplingParams(**row))
        return prompts, params, stream

    @staticmethod
    def _response(completions):
        def column(values, dtype):
            return np.array(values, dtype=dtype).reshape(-1, 1)

        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(
                    "text_output", column([c.text.encode() for c in completions], np.object_)
                ),
                pb_utils.Tensor(
                    "finish_reason",
                    column([c.finish_reason.encode() for c in completions], np.object_),
                ),
                pb_utils.Tensor(
                    "prompt_tokens", column([c.prompt_tokens for c in completions], np.int32)
                ),
                pb_utils.Tensor(
                    "completion_tokens",
                    column([c.completion_tokens for c in completions], np.int32),
                ),
            ]
        )

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                self._execute_decoupled(request)
            return None
        parsed, responses = [], [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                parsed.append((i, *self._rows(request)))
            except Exception as e:  # noqa: BLE001 - a bad request fails alone, not the batch
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        prompts = [p for _, ps, _, _ in parsed for p in ps]
        params = [q for _, _, qs, _ in parsed for q in qs]
        try:
            completions = self.generator.generate(prompts, params) if prompts else []
        except Exception as e:  # noqa: BLE001 - Triton answers errors, it must not crash
            for i, *_ in parsed:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
            return responses
        start = 0
        for i, ps, _, _ in parsed:
            responses[i] = self._response(completions[start : start + len(ps)])
            start += len(ps)
        return responses

    def _execute_decoupled(self, request):
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            prompts, params, stream = self._rows(request)
            if stream and len(prompts) == 1:
                for delta in self.generator.stream(prompts[0], params[0]):
                    out = pb_utils.Tensor(
                        "text_output", np.array([[delta.encode()]], dtype=np.object_)
                    )
                    sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sender.send(flags=final)
            else:
                sender.send(self._response(self.generator.generate(prompts, params)), flags=final)
        except Exception as e:  # noqa: BLE001 - Triton answers errors, it must not crash
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=final)

    def finalize(self):
        self.generator = None
