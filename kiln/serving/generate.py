"""Text generation for kiln models: batched, KV-cached decoding with stop strings.

Decoding runs the model's own forward with a `KVCache` (kiln.model.kv_cache): prompts
are right-padded into one prefill, then every row decodes one token per [B, 1] step at its own
length.


gen = Generator.load("runs/.../export/hf")          # or a kiln checkpoint dir (+ tokenizer=)
[c] = gen.generate(["Once upon a time"], SamplingParams(max_new_tokens=32))
for delta in gen.stream("Once upon a time", SamplingParams(temperature=0.8, seed=1)): ...
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel
from torch import nn

from kiln.model.config import ModelConfig
from kiln.model.formats.weights import build_model, read_weights
from kiln.model.kv_cache import KVCache
from kiln.platform.errors import InputError
from kiln.serving.sampling import SamplingParams, make_generator, sample_next
from kiln.text.tokenizer import end_of_text_ids, find_tokenizer

__all__ = ["Completion", "Generator", "SamplingParams"]


class Completion(BaseModel):
    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Sequence:
    """One prompt being completed: its tokens so far and why it stopped."""

    prompt_ids: list[int]
    params: SamplingParams
    rng: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None  # set when a stop string cut the text
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class Generator:
    """A kiln `Transformer` plus a `tokenizers.Tokenizer`, ready to complete prompts."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        model_name: str = "kiln",
        eos_token_ids: Sequence[int] | None = None,
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
    ) -> Generator:
        """From an exported HF dir, an ExportedModel dir (with `hf/`) or a kiln checkpoint dir."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise InputError(f"{path}: no such model directory")
        path, cfg, state = read_weights(path)
        tok, tok_dir = find_tokenizer(tokenizer, search=[path, os.path.dirname(path.rstrip("/"))])
        model = build_model(cfg, state, device=device, dtype=dtype)
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
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_cache: bool = True,
    ) -> list[Completion]:
        """Complete every prompt (one batch). `params` is shared or one per prompt."""
        seqs = self._sequences(prompts, params)
        steps = self._decode_cached(seqs) if use_cache else self._decode_uncached(seqs)
        for _ in steps:
            pass
        return [self._completion(s) for s in seqs]

    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams | Sequence[SamplingParams],
        use_cache: bool = True,
    ) -> list[list[int]]:
        """Token ids in, new token ids out (no tokenizer needed; stop strings ignored)."""
        plist = _per_prompt(params, len(prompt_ids))
        seqs = [
            _Sequence(list(p), q.model_copy(update={"stop": []}), make_generator(q, self.device))
            for p, q in zip(prompt_ids, plist, strict=False)
        ]
        for _ in self._decode_cached(seqs) if use_cache else self._decode_uncached(seqs):
            pass
        return [s.token_ids for s in seqs]

    def stream(self, prompt: str, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas as tokens arrive; joined they equal `generate([prompt])[0].text`."""
        [seq] = self._sequences([prompt], params)
        sent = ""
        for _ in self._decode_cached([seq]):
            text = self._text(seq)
            if not seq.done:
                text = _hold_back(text, seq.params.stop)
            if len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent) :]
                sent = text
        final = self._text(seq)
        if len(final) > len(sent):
            yield final[len(sent) :]

    # ---- internals -----------------------------------------------------------------------

    def _sequences(self, prompts, params) -> list[_Sequence]:
        plist = _per_prompt(params, len(prompts))
        seqs = []
        for prompt, p in zip(prompts, plist, strict=False):
            ids = self.encode(prompt)
            if len(ids) >= self.max_seq_len:
                raise InputError(
                    f"prompt has {len(ids)} tokens; the model's context is {self.max_seq_len}"
                )
            seqs.append(_Sequence(ids, p, make_generator(p, self.device)))
        return seqs

    def _push(self, seq: _Sequence, token: int) -> None:
        """Record one new token and decide whether the sequence is finished."""
        if token in self.eos_token_ids:
            seq.finish_reason = "stop"
            return
        seq.token_ids.append(token)
        if seq.params.stop:
            text = self.decode(seq.token_ids)
            cuts = [i for i in (text.find(s) for s in seq.params.stop if s) if i >= 0]
            if cuts:
                seq.text = text[: min(cuts)]
                seq.finish_reason = "stop"
                return
        if len(seq.token_ids) >= seq.params.max_new_tokens:
            seq.finish_reason = "length"
        elif len(seq.prompt_ids) + len(seq.token_ids) >= self.max_seq_len:
            seq.finish_reason = "length"  # the context is full

    def _text(self, seq: _Sequence) -> str:
        return seq.text if seq.text is not None else self.decode(seq.token_ids)

    def _completion(self, seq: _Sequence) -> Completion:
        return Completion(
            text=self._text(seq),
            token_ids=seq.token_ids,
            finish_reason=seq.finish_reason or "length",
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.token_ids),
        )

    @torch.inference_mode()
    def _decode_cached(self, seqs: list[_Sequence]) -> Iterator[None]:
        """Prefill the right-padded prompts once, then one [B, 1] step per token (yields each)."""
        for s in seqs:
            if s.params.max_new_tokens == 0:
                s.finish_reason = "length"
        active = [s for s in seqs if not s.done]
        if not active:
            return
        lengths = torch.tensor([len(s.prompt_ids) for s in active], device=self.device)
        width = int(lengths.max())
        budget = max(s.params.max_new_tokens for s in active)
        tokens = torch.zeros(len(active), width, dtype=torch.long, device=self.device)
        for row, s in enumerate(active):
            tokens[row, : len(s.prompt_ids)] = torch.tensor(s.prompt_ids)
        cache = KVCache.for_model(
            self.model.cfg,
            len(active),
            # a row stops when its own prompt + completion fill the context
            min(width + budget, self.max_seq_len),
            dtype=self.model.tok_embeddings.weight.dtype,
            device=self.device,
        )
        logits = self.model(tokens, kv_cache=cache)
        cache.truncate(lengths)  # forget the pads
        logits = logits[torch.arange(len(active), device=self.device), lengths - 1]
        while True:
            next_tokens = sample_next(
                logits,
                [s.params for s in active],
                [s.rng for s in active],
                [(s.prompt_ids, s.token_ids) for s in active],  # for penalties
            ).tolist()
            for s, t in zip(active, next_tokens, strict=True):
                self._push(s, t)
            yield
            keep = [i for i, s in enumerate(active) if not s.done]
            if not keep:
                return
            if len(keep) < len(active):  # finished rows leave the batch
                cache.keep_rows(torch.tensor(keep, device=self.device))
                active = [active[i] for i in keep]
                next_tokens = [next_tokens[i] for i in keep]
            step = torch.tensor(next_tokens, device=self.device)[:, None]
            logits = self.model(step, kv_cache=cache)[:, -1]

    @torch.inference_mode()
    def _decode_uncached(self, seqs: list[_Sequence]) -> Iterator[None]:
        """The reference: the model's own forward over the whole sequence at every step."""
        for s in seqs:
            if s.params.max_new_tokens == 0:
                s.finish_reason = "length"
            while not s.done:
                ids = torch.tensor([s.prompt_ids + s.token_ids], device=self.device)
                logits = self.model(ids)[:, -1]
                history = [(s.prompt_ids, s.token_ids)]
                self._push(s, sample_next(logits, [s.params], [s.rng], history).item())
                yield


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


def _hold_back(text: str, stops: list[str]) -> str:
    """Withhold a tail that may still become a stop string, or is half a UTF-8 character."""
    text = text.rstrip("\ufffd")
    cut = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]
