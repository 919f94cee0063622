"""The local backend: kiln's `Generator` in the Serve replica, its jobs on the continuous-batching
`Engine` (kiln.engine): each joins the running batch at the next decoding step, in its own
KV-cache slot, with its own parameters, and fails alone."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import torch

from kiln.engine import Engine, complete, stream_events
from kiln.engine.detokenize import CONTEXT_TOKENS, IncrementalText, completion_text, hold_back
from kiln.engine.generator import Generator
from kiln.engine.grammar import Grammar
from kiln.engine.logprobs import score_tokens, token_bytes
from kiln.engine.lora_adapter import LoRAAdapter
from kiln.engine.lora_config import LoRAServingConfig
from kiln.engine.lora_registry import UnknownAdapter
from kiln.platform.errors import InputError, KilnError
from kiln.serving.api.protocol import RequestError
from kiln.serving.backends.backend import BatchingConfig, Job, Prompt, Result
from kiln.text.chat_template import end_of_turn_markers, load_chat_config
from kiln.text.tokenizer import vocabulary_ids

if TYPE_CHECKING:
    from kiln.engine.logprobs import TokenScore
    from kiln.engine.request import EngineEvent
    from kiln.engine.sampler import SamplingParams

log = logging.getLogger("kiln")


class LocalBackend:
    def __init__(
        self,
        model_dir: str,
        model_name: str | None = None,
        batching: BatchingConfig | None = None,
        *,
        dtype: str = "float32",
        quantize: str | None = None,
        quantize_group_size: int = 32,
        cpu_compile: bool = False,
        lora: LoRAServingConfig | None = None,
    ):
        """`lora`: serve PEFT adapters over this model, chosen per request by `model`.
        `cpu_compile`: a bf16 model on a CPU with bf16 matrix units gets its RMSNorms compiled
        by inductor at load (kiln/model/cpu_norm.py)."""
        # fp8's kernels are CUDA's: that model lives on the replica's GPU (Ray sets its device)
        device = "cuda" if quantize == "fp8" and torch.cuda.is_available() else None
        self.generator = Generator.load(
            model_dir,
            device=device,
            dtype=getattr(torch, dtype),
            quantize=quantize,
            quantize_group_size=quantize_group_size,
            compile_norms=cpu_compile,
        )
        self.model_name = model_name or self.generator.model_name
        self.context_length: int | None = self.generator.max_seq_len
        self.vocab_size = int(self.generator.model.tok_embeddings.weight.shape[0])
        self.chat_template, self.special_tokens = load_chat_config(self.generator.tokenizer_dir)
        self._stop_at_end_of_turn()
        self.eos_token_ids: set[int] = self.generator.eos_token_ids
        batching = batching or BatchingConfig()
        # one model, one forward at a time: the engine's steps and scoring never interleave
        self._lock = threading.Lock()
        lora_options = lora.engine_options() if lora is not None else {}
        self._engine = Engine(
            self.generator, **batching.engine_options(), **lora_options, lock=self._lock
        )
        for name, path in (lora.adapters if lora is not None else {}).items():
            self._check_adapter_name(name)
            self._engine.loras.add(name, path)
        self._engine.start()
        self._inferences = 0  # jobs completed

    def _stop_at_end_of_turn(self) -> None:
        """A chat model's end-of-turn token ends a completion, as its end-of-text does."""
        markers = end_of_turn_markers(self.chat_template, self.special_tokens)
        self.generator.eos_token_ids.update(vocabulary_ids(self.generator.tokenizer, markers))

    # ---- checks before a job joins a batch ------------------------------------------------

    async def prepare(
        self, prompt: Prompt, params: SamplingParams, *, truncate: int | None, fit_context: bool
    ) -> Job:
        ids = self._prompt_ids(prompt)
        if params.grammar is not None:
            await self._check_grammar(params.grammar)
        if truncate is not None and len(ids) > truncate:
            ids = ids[-truncate:]  # keep the end of the prompt, as vLLM does
            prompt = ids
        ctx = self.generator.max_seq_len
        room = ctx - len(ids)
        if room < 1:
            raise RequestError(
                f"prompt has {len(ids)} tokens; the model's context is {ctx}", param="prompt"
            )
        if params.max_new_tokens > room:
            if not (fit_context or truncate is not None):
                raise RequestError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({params.max_new_tokens}) exceed "
                    f"the model's context of {ctx} tokens; lower max_tokens or set "
                    "truncate_prompt_tokens",
                    param="max_tokens",
                )
            params = params.model_copy(update={"max_new_tokens": room})
        return Job(prompt, params, ids)

    async def _check_grammar(self, grammar: Grammar) -> None:
        """A 400 naming the field for a grammar the engine cannot build (off the event loop:
        the first one builds the vocabulary's index, ~0.5 s for 49k tokens)."""
        try:
            await asyncio.to_thread(self._engine.grammars.check, grammar)
        except InputError as e:
            raise RequestError(str(e), param=grammar.field) from None

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            try:
                return self.generator.encode(prompt)
            except KilnError as e:
                raise RequestError(str(e), param="prompt") from None
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})",
                param="prompt",
            )
        return list(prompt)

    # ---- generation ---------------------------------------------------------------------

    async def complete(self, jobs: list[Job]) -> list[Result]:
        """Each job's result; the first failing job's error is raised (only this request's)."""
        try:
            return list(await asyncio.gather(*(self._run_continuous(j) for j in jobs)))
        except UnknownAdapter as e:  # unloaded since the route checked the name
            raise RequestError(str(e), 404, "model") from e
        except KilnError as e:
            raise RequestError(str(e)) from e

    async def _run_continuous(self, job: Job) -> Result:
        """One job through the engine; a token-id prompt's stop strings cut it afterwards
        (`_result_from_ids`)."""
        assert job.prompt_ids is not None
        by_ids = not isinstance(job.prompt, str)
        params = job.params.model_copy(update={"stop": []}) if by_ids else job.params
        end = await complete(
            self._engine, job.prompt_ids, params, cache_salt=job.cache_salt, lora=job.lora
        )
        self._inferences += 1
        if by_ids:
            return self._result_from_ids(job, end.token_ids)
        text = self._final_text(job, end)
        reason = end.finish_reason or "length"
        cut = reason == "stop" and self._has_stop(end.token_ids, job.params.stop)
        return Result(
            text,
            reason,  # type: ignore[arg-type]
            len(job.prompt_ids),
            len(end.token_ids),
            job.prompt_ids,
            end.token_ids,
            ended_by_eos=reason == "stop" and not cut,
        )

    async def _stream_continuous(self, job: Job) -> AsyncIterator[str]:
        """Text deltas as tokens arrive, held back as `Generator.stream` does (a tail that may
        become a stop string, half a UTF-8 character)."""
        assert job.prompt_ids is not None
        sent = ""
        text_so_far = IncrementalText(self.generator.decode, job.prompt_ids[-CONTEXT_TOKENS:])
        events = stream_events(
            self._engine,
            job.prompt_ids,
            job.params,
            cache_salt=job.cache_salt,
            lora=job.lora,
            coalesce=True,
        )
        async for event in events:
            if event.kind == "finish":
                self._inferences += 1
                job.finish_reason = "length" if event.finish_reason == "length" else "stop"
                job.completion_tokens = len(event.token_ids)
                end = self._final_text(job, event)
                if len(end) > len(sent):
                    yield end[len(sent) :]
                return
            text = hold_back(text_so_far.update(event.token_ids), job.params.stop)
            if len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent) :]
                sent = text

    def _result_from_ids(self, job: Job, new: list[int]) -> Result:
        """A text prompt's result for token ids: cut at the first stop string, finish reason."""
        prompt_ids = job.prompt_ids or []
        if job.params.stop:
            for k in range(1, len(new) + 1):
                text = self._text(job, new[:k])
                cuts = [c for c in (text.find(s) for s in job.params.stop) if c >= 0]
                if cuts:
                    return Result(
                        text[: min(cuts)], "stop", len(prompt_ids), k, prompt_ids, new[:k]
                    )
        full = len(new) >= job.params.max_new_tokens or (
            len(prompt_ids) + len(new) >= self.generator.max_seq_len
        )
        reason = "length" if full else "stop"
        text = self._text(job, new)
        return Result(text, reason, len(prompt_ids), len(new), prompt_ids, new, not full)

    def _final_text(self, job: Job, end: EngineEvent) -> str:
        """A finished request's text, decoded as its stream was (`_text`); cut at the first
        stop string when one ended it (the engine cut its own decode, without the prompt)."""
        text = self._text(job, end.token_ids)
        if end.text is None:
            return text
        cuts = [c for c in (text.find(s) for s in job.params.stop if s) if c >= 0]
        return text[: min(cuts)] if cuts else end.text

    def _text(self, job: Job, ids: list[int]) -> str:
        """The completion's text, decoded after the prompt's last tokens (a character split
        between a token-id prompt and its completion is the completion's, not a U+FFFD)."""
        context = (job.prompt_ids or [])[-CONTEXT_TOKENS:]
        return completion_text(self.generator.decode, ids, context)

    def _has_stop(self, token_ids: list[int], stops: list[str]) -> bool:
        text = self.generator.decode(token_ids) if stops else ""
        return any(s in text for s in stops)

    async def stream(self, job: Job) -> AsyncIterator[str]:
        if not isinstance(job.prompt, str):  # token ids: one delta with the whole text
            (result,) = await self.complete([job])
            job.finish_reason = result.finish_reason
            job.completion_tokens = result.completion_tokens
            yield result.text
            return
        try:
            async for delta in self._stream_continuous(job):
                yield delta
        except UnknownAdapter as e:
            raise RequestError(str(e), 404, "model") from e
        except KilnError as e:  # this request's own mistake (its grammar): a 400, not a 500
            raise RequestError(str(e)) from e

    # ---- LoRA adapters (kiln.engine.lora_registry) ---------------------------------------

    def lora_adapters(self) -> list[LoRAAdapter]:
        """The adapters served over this model, in load order (none without LoRA serving)."""
        loras = self._engine.loras
        return loras.adapters() if loras is not None else []

    def lora_requests(self) -> dict | None:
        """The adapters of running and waiting requests and the slot count (vLLM's
        lora_requests_info); None without LoRA serving. Read from another thread: a moment's."""
        loras, sched = self._engine.loras, self._engine.scheduler
        if loras is None:
            return None
        running, waiting = list(sched.running), list(sched.waiting)  # copied under the GIL

        def names(requests) -> list[str]:
            return sorted({r.lora.name for r in requests if r.lora is not None})

        return {
            "max_lora": loras.slots.max_loras,
            "running": names(running),
            "waiting": names(waiting),
        }

    async def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT folder `path` as `name` from now on (RequestError 400 naming the
        field when LoRA serving is off, the name is taken or the folder does not fit)."""
        loras = self._lora_registry()
        try:
            self._check_adapter_name(name)
            await asyncio.to_thread(loras.add, name, path)  # reads the folder: off the loop
        except KilnError as e:
            field = str(e).partition(":")[0]
            raise RequestError(str(e), param=field if field.startswith("lora_") else None) from e

    async def unload_lora(self, name: str) -> None:
        """Stop serving `name` (404 when no such adapter); its running requests finish."""
        try:
            self._lora_registry().remove(name)
        except UnknownAdapter as e:
            raise RequestError(str(e), 404, "lora_name") from e

    def _lora_registry(self):
        if self._engine.loras is None:
            raise RequestError(
                "LoRA adapters are off on this server: start it with --lora NAME=PATH or "
                "--max-loras N"
            )
        return self._engine.loras

    def _check_adapter_name(self, name: str) -> None:
        if name == self.model_name:
            raise InputError(f"lora_name: {name!r} is the base model's name")

    # ---- log-probabilities --------------------------------------------------------------

    async def score(self, ids: list[int], top: int) -> list[TokenScore]:
        def work():
            with self._lock:
                return score_tokens(self.generator.model, ids, top)

        return await asyncio.to_thread(work)

    def token_texts(self, ids: list[int]) -> list[str]:
        tok = self.generator.tokenizer
        return [tok.decode([i], skip_special_tokens=False) for i in ids]

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        return [token_bytes(self.generator.tokenizer, i) for i in ids]

    async def ready(self) -> bool:
        return True

    def engine_queues(self) -> tuple[int, int] | None:
        """(running, waiting) requests of the continuous engine; None on the batch path."""
        if self._engine is None:
            return None
        scheduler = self._engine.scheduler  # read from another thread: a moment's counts
        return len(scheduler.running), len(scheduler.waiting)

    def engine_stats(self) -> dict[str, float]:
        """The engine's prefix-cache, preemption and KV-block counts (Engine.stats)."""
        return self._engine.stats()

    def stats(self) -> dict[str, int]:
        return {"inference_count": self._inferences, "execution_count": self._engine.steps}

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.stop)
