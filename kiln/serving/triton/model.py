"""Triton python-backend model for a kiln language model (copied to `<repo>/<model>/1/model.py`).

Inputs follow the vLLM backend's convention: `text_input` (string) or `messages` (a JSON list of
{role, content}, rendered with the model's chat template, ChatML when it has none), plus optional
`max_tokens`, `temperature`, `top_k`, `top_p`, `seed`, `stop` and `stream`; output `text_output`
(the completion, without the prompt) plus `finish_reason`, `prompt_tokens`, `completion_tokens`.

Every row runs on kiln's continuous-batching engine (kiln.engine): rows from the
requests of one execute, and with a decoupled transaction policy rows from later executes too,
join the running batch at the next decoding step, each in its own KV-cache slot, and fail alone.
Decoupled: execute returns at once and the engine thread sends each request's response (with
`stream: true`, one response per text delta). Otherwise execute waits for its rows.

Runs in Triton's python stub with torch, safetensors, tokenizers, pydantic, jinja2 and numpy < 2;
the kiln code it needs is vendored next to this file under `runtime/` (no Ray).
"""

import faulthandler
import json
import os
import signal
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))
# `kill -USR1 <stub>` prints every thread's stack to the server log: kiln's TritonServer does so
# when a start times out, to show where `initialize` hung
faulthandler.register(signal.SIGUSR1, all_threads=True)
sys.path.insert(0, os.path.join(HERE, "runtime"))

# the vendored kiln, found through the path set just above
from kiln.engine import Engine  # noqa: E402
from kiln.engine.detokenize import IncrementalText, hold_back  # noqa: E402
from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.text.chat_template import ChatTemplate  # noqa: E402
from kiln.text.tokenizer import vocabulary_ids  # noqa: E402

OPTIONAL_INPUTS = {
    "max_tokens": ("max_new_tokens", int),
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "seed": ("seed", int),
}


def _strings(array) -> list:
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]


def _error(message):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(message)))


class _Rows:
    """One Triton request's rows in the engine: collects each row's end and calls `done` once
    every row has finished (or the first has failed)."""

    def __init__(self, n, done, on_token=None):
        self.ends = [None] * n
        self.left = n
        self.done = done  # called with (ends, error) on the engine thread
        self.on_token = on_token
        self.lock = threading.Lock()
        self.closed = False

    def listener(self, row):
        def hear(event):
            if event.kind == "token":
                if self.on_token is not None:
                    self.on_token(event)
                return
            with self.lock:
                if self.closed:
                    return
                if event.kind == "error":
                    self.closed = True
                    self.done(None, event.error)
                    return
                self.ends[row] = event
                self.left -= 1
                if self.left == 0:
                    self.closed = True
                    self.done(self.ends, None)

        return hear


class TritonPythonModel:
    def initialize(self, args):
        import torch

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
        hf_dir = os.path.join(HERE, "hf")
        self.generator = Generator.load(
            hf_dir,
            device=device,
            dtype=dtype,
            model_name=args["model_name"],
            quantize=params.get("quantize") or None,
            quantize_group_size=int(params.get("quantize_group_size", "32")),
        )
        self._chat_setup(hf_dir, json.loads(params.get("end_of_turn", "[]")))
        self.engine = Engine(
            self.generator,
            max_slots=int(params.get("engine_slots", "8")),
            prefill_chunk=int(params.get("prefill_chunk", "256")),
        ).start()

    def _chat_setup(self, hf_dir, end_of_turn):
        """The chat template (the model's, else ChatML) and its end-of-turn tokens, which end a
        completion as the end-of-text token does (as the REST local backend does)."""

        try:
            self.template = ChatTemplate.from_pretrained(hf_dir)
        except Exception:  # noqa: BLE001 - no template of its own: ChatML
            self.template = None
        if self.template is None:
            specials = {}
            path = os.path.join(hf_dir, "tokenizer_config.json")
            if os.path.exists(path):
                with open(path) as f:
                    cfg = json.load(f)
                specials = {
                    k: v for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str)
                }
            self.template = ChatTemplate.builtin("chatml", specials)
        self.generator.eos_token_ids.update(vocabulary_ids(self.generator.tokenizer, end_of_turn))

    # ---- one request's rows ([batch, 1] tensors) ------------------------------------------

    def _prompts(self, request):
        messages = pb_utils.get_input_tensor_by_name(request, "messages")
        if messages is not None:
            prompts = []
            for raw in _strings(messages.as_numpy()):
                chat = json.loads(raw)
                if not isinstance(chat, list) or not all(
                    isinstance(m, dict) and "role" in m and "content" in m for m in chat
                ):
                    raise ValueError("messages: expected a JSON list of {role, content} objects")
                prompts.append(self.template.render(chat, add_generation_prompt=True))
            return prompts
        text = pb_utils.get_input_tensor_by_name(request, "text_input")
        if text is None:
            raise ValueError("text_input or messages is required")
        return _strings(text.as_numpy())

    def _rows(self, request):
        prompts = self._prompts(request)
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
        ids = [self.generator.encode(p) for p in prompts]
        return ids, params, stream

    def _submit(self, ids, params, rows):
        """Every row into the engine; a row the engine refuses (a prompt that fills the
        context) fails the request before anything runs."""
        for i, (row_ids, row_params) in enumerate(zip(ids, params, strict=True)):
            self.engine.submit(row_ids, row_params, rows.listener(i))

    def _response(self, ids, ends):
        def column(values, dtype):
            return np.array(values, dtype=dtype).reshape(-1, 1)

        decode = self.generator.decode
        texts = [e.text if e.text is not None else decode(e.token_ids) for e in ends]
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text_output", column([t.encode() for t in texts], np.object_)),
                pb_utils.Tensor(
                    "finish_reason",
                    column([(e.finish_reason or "length").encode() for e in ends], np.object_),
                ),
                pb_utils.Tensor("prompt_tokens", column([len(i) for i in ids], np.int32)),
                pb_utils.Tensor(
                    "completion_tokens", column([len(e.token_ids) for e in ends], np.int32)
                ),
            ]
        )

    # ---- execute ---------------------------------------------------------------------------

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                self._execute_decoupled(request)
            return None
        responses = [None] * len(requests)
        waits = []
        for i, request in enumerate(requests):
            try:
                ids, params, _ = self._rows(request)
            except Exception as e:  # noqa: BLE001 - a bad request fails alone, not the batch
                responses[i] = _error(e)
                continue
            finished = threading.Event()

            def done(ends, error, i=i, ids=ids, finished=finished):
                responses[i] = _error(error) if error is not None else (ids, ends)
                finished.set()

            rows = _Rows(len(ids), done)
            try:
                self._submit(ids, params, rows)
            except Exception as e:  # noqa: BLE001
                rows.closed = True
                responses[i] = _error(e)
                continue
            waits.append((i, finished))
        for i, finished in waits:
            finished.wait()
            if isinstance(responses[i], tuple):
                responses[i] = self._response(*responses[i])
        return responses

    def _execute_decoupled(self, request):
        """Rows go to the engine; its thread sends the response(s) when they are ready."""

        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            ids, params, stream = self._rows(request)
        except Exception as e:  # noqa: BLE001 - Triton answers errors, it must not crash
            sender.send(_error(e), flags=final)
            return
        streaming = stream and len(ids) == 1
        sent = [""]
        text = IncrementalText(self.generator.decode)
        stops = params[0].stop if params else []

        def send_delta(delta):
            out = pb_utils.Tensor("text_output", np.array([[delta.encode()]], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))

        def on_token(event):
            now = hold_back(text.update(event.token_ids), stops)
            if len(now) > len(sent[0]) and now.startswith(sent[0]):
                send_delta(now[len(sent[0]) :])
                sent[0] = now

        def done(ends, error):
            if error is not None:
                sender.send(_error(error), flags=final)
            elif streaming:
                end = ends[0]
                full = end.text if end.text is not None else self.generator.decode(end.token_ids)
                if len(full) > len(sent[0]):
                    send_delta(full[len(sent[0]) :])
                sender.send(flags=final)
            else:
                sender.send(self._response(ids, ends), flags=final)

        rows = _Rows(len(ids), done, on_token if streaming else None)
        try:
            self._submit(ids, params, rows)
        except Exception as e:  # noqa: BLE001
            rows.closed = True
            sender.send(_error(e), flags=final)

    def finalize(self):
        self.engine.stop()
        self.generator = None
