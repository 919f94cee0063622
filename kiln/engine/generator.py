"""The offline API: load a model and its tokenizer, complete prompts. Decoding is the engine's
(`Engine.run` on the caller's thread): every prompt is prefilled in the first step, then each
row decodes one token per step at its own length, with its own sampling parameters and seed.

gen = Generator.load("runs/.../export/hf")          # or a kiln checkpoint dir (+ tokenizer=)
[c] = gen.generate(["Once upon a time"], SamplingParams(max_new_tokens=32))
for delta in gen.stream("Once upon a time", SamplingParams(temperature=0.8, seed=1)): ...
"""

from __future__ import annotations

import json
import os
from collections import abc
from collections.abc import Iterator
from typing import Literal

import torch
from pydantic import BaseModel
from torch import nn

from kiln.engine.detokenize import hold_back
from kiln.engine.engine import Engine
from kiln.engine.request import EngineEvent, EngineRequest
from kiln.engine.sampler import SamplingParams
from kiln.engine.sequence import Sequence
from kiln.model.config import ModelConfig
from kiln.model.cpu_linear import pack_for_cpu
from kiln.model.formats.weights import build_model, read_weights
from kiln.model.quantize import quantize_model
from kiln.platform.errors import InputError
from kiln.text.tokenizer import end_of_text_ids, find_tokenizer

__all__ = ["Completion", "Generator", "SamplingParams"]


class Completion(BaseModel):
    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int


class Generator:
    """A kiln `Transformer` plus a `tokenizers.Tokenizer`, ready to complete prompts."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        model_name: str = "kiln",
        eos_token_ids: abc.Sequence[int] | None = None,
        max_seq_len: int | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.eos_token_ids = set(
            eos_token_ids if eos_token_ids is not None else end_of_text_ids(tokenizer)
        )
        self.max_seq_len = max_seq_len or model.cfg.max_seq_len
        self.tokenizer_dir: str | None = None

    @property
    def model_config(self) -> ModelConfig:
        return self.model.cfg

    # ---- loading -------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str,
        *,
        tokenizer=None,
        model_name: str | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        quantize: str | None = None,
        quantize_group_size: int = 32,
        compile_norms: bool = False,
    ) -> Generator:
        """From an exported HF dir, an ExportedModel dir (with `hf/`) or a kiln checkpoint dir.
        `quantize` ("int8", "int4", "fp8"): its linear layers' weights quantized after loading
        (kiln.model.quantize; `quantize_group_size`: int4's inputs per scale). Otherwise a CPU
        model's linear layers are laid out for this CPU's kernels (cpu_linear: bf16 packed for
        bf16 matrix units or multiplied in fp32 without them, fp32 column-major) and, with
        `compile_norms`, a packed bf16 model's RMSNorms compiled by inductor (cpu_norm)."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise InputError(f"{path}: no such model directory")
        path, cfg, state = read_weights(path)
        tok, tok_dir = find_tokenizer(tokenizer, search=[path, os.path.dirname(path.rstrip("/"))])
        model = build_model(cfg, state, device=device, dtype=dtype)
        if quantize is not None:
            quantize_model(model, quantize, group_size=quantize_group_size)
        else:
            pack_for_cpu(model, compile_norms=compile_norms)
        name = (
            model_name
            or _export_info(path).get("model_name")
            or os.path.basename(os.path.normpath(path))
        )
        if name in ("hf", "latest", "model") or name.startswith("step-"):
            name = "kiln"
        gen = cls(model, tok, model_name=name, eos_token_ids=end_of_text_ids(tok, tok_dir))
        gen.tokenizer_dir = tok_dir
        return gen

    # ---- tokens <-> text -----------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text).ids
        if not ids:
            if not self.eos_token_ids:
                raise InputError(
                    "prompt is empty and the tokenizer has no end-of-text token to start from"
                )
            ids = [min(self.eos_token_ids)]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def device(self) -> torch.device:
        return self.model.tok_embeddings.weight.device

    # ---- generation ----------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str],
        params: SamplingParams | abc.Sequence[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Complete every prompt (one batch). `params` is shared or one per prompt."""
        requests = self._run([self.encode(p) for p in prompts], _per_prompt(params, len(prompts)))
        return [self._completion(r) for r in requests]

    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams | abc.Sequence[SamplingParams],
    ) -> list[list[int]]:
        """Token ids in, new token ids out (no tokenizer needed; stop strings ignored)."""
        plist = [q.model_copy(update={"stop": []}) for q in _per_prompt(params, len(prompt_ids))]
        return [r.seq.token_ids for r in self._run([list(p) for p in prompt_ids], plist)]

    def stream(self, prompt: str, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas as tokens arrive; joined they equal `generate([prompt])[0].text`."""
        engine, [request] = self._submit([self.encode(prompt)], _per_prompt(params, 1))
        seq, sent = request.seq, ""
        for _ in engine.run([request]):
            _raise_failure([request])
            text = self._text(seq)
            if not seq.done:
                text = hold_back(text, seq.params.stop)
            if len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent) :]
                sent = text
        _raise_failure([request])
        final = self._text(seq)
        if len(final) > len(sent):
            yield final[len(sent) :]

    # ---- internals -----------------------------------------------------------------------

    def _submit(
        self, prompts: list[list[int]], params: list[SamplingParams]
    ) -> tuple[Engine, list[EngineRequest]]:
        """An engine for this batch (a slot per prompt; every prompt prefilled in the first step)
        and the batch submitted to it."""
        engine = Engine(self, max_slots=max(1, len(prompts)), prefill_chunk=1 << 30)
        requests = [engine.submit(ids, p, _unheard) for ids, p in zip(prompts, params, strict=True)]
        return engine, requests

    def _run(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[EngineRequest]:
        engine, requests = self._submit(prompts, params)
        for _ in engine.run(requests):
            _raise_failure(requests)
        return _raise_failure(requests)

    def _text(self, seq: Sequence) -> str:
        return seq.text if seq.text is not None else self.decode(seq.token_ids)

    def _completion(self, request: EngineRequest) -> Completion:
        seq = request.seq
        return Completion(
            text=self._text(seq),
            token_ids=seq.token_ids,
            finish_reason=seq.finish_reason or "length",
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.token_ids),
        )


def _unheard(event: EngineEvent) -> None:
    """The offline API reads each request's sequence (and error) itself."""


def _raise_failure(requests: list[EngineRequest]) -> list[EngineRequest]:
    for request in requests:
        if request.error is not None:
            raise request.error
    return requests


def _export_info(path: str) -> dict:
    """`kiln_export.json` that export_hf writes next to the weights (model name, kiln shape)."""
    info = os.path.join(path, "kiln_export.json")
    if not os.path.exists(info):
        return {}
    with open(info) as f:
        return json.load(f)


def _per_prompt(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return params
