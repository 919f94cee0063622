"""The local backend: kiln's `Generator` in the Serve replica.

With `engine: continuous` (BatchingConfig) jobs go to the continuous-batching `Engine`
(kiln.serving.engine): each joins the running batch at the next decoding step, in its own KV-cache
slot, and fails alone. With `engine: batch` each job is queued on its own and
a `MicroBatcher` (what `@serve.batch` does, without needing a replica) gathers concurrent jobs,
from any requests and each with its own parameters, into one batched, KV-cached generate call.
A batch that fails is re-run one job at a time, so only the job that fails alone gets the error."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from kiln.platform.errors import KilnError
from kiln.serving.backends import BatchingConfig, Job, Prompt, Result
from kiln.serving.batcher import MicroBatcher
from kiln.serving.engine import Engine, complete, stream_events
from kiln.serving.engine.detokenize import IncrementalText
from kiln.serving.protocol import RequestError
from kiln.text.chat_template import end_of_turn_markers, load_chat_config

if TYPE_CHECKING:
    from kiln.serving.logprobs import TokenScore
    from kiln.serving.sampling import SamplingParams

log = logging.getLogger("kiln")


class LocalBackend:
    def __init__(
        self, model_dir: str, model_name: str | None = None, batching: BatchingConfig | None = None
    ):
        from kiln.serving.generate import Generator

        self.generator = Generator.load(model_dir)
        self.model_name = model_name or self.generator.model_name
        self.context_length: int | None = self.generator.max_seq_len
        self.vocab_size = int(self.generator.model.tok_embeddings.weight.shape[0])
        self.chat_template, self.special_tokens = load_chat_config(self.generator.tokenizer_dir)
        self._stop_at_end_of_turn()
        self.eos_token_ids: set[int] = self.generator.eos_token_ids
        batching = batching or BatchingConfig()
        self._batcher = MicroBatcher(
            self._run_batch, batching.max_batch_size, batching.batch_wait_timeout_s
        )
        # one model, one forward at a time: a stream and a batch never interleave in torch
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        if batching.engine == "continuous":
            self._engine = Engine(
                self.generator,
                max_slots=batching.max_batch_size,
                prefill_chunk=batching.prefill_chunk,
                lock=self._lock,
            ).start()
        self._inferences = 0  # jobs completed
        self._executions = 0  # generate() calls (batches)

    def _stop_at_end_of_turn(self) -> None:
        """A chat model's end-of-turn token ends a completion, as its end-of-text does."""
        tok = self.generator.tokenizer
        for marker in end_of_turn_markers(self.chat_template, self.special_tokens):
            token_id = tok.token_to_id(marker)
            if token_id is not None:
                self.generator.eos_token_ids.add(token_id)

    # ---- checks before a job joins a batch ------------------------------------------------

    async def prepare(
        self, prompt: Prompt, params: SamplingParams, *, truncate: int | None, fit_context: bool
    ) -> Job:
        ids = self._prompt_ids(prompt)
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
        run = self._batcher.submit if self._engine is None else self._run_continuous
        try:
            return list(await asyncio.gather(*(run(j) for j in jobs)))
        except KilnError as e:
            raise RequestError(str(e)) from e

    async def _run_batch(self, jobs: list[Job]) -> list[Result | Exception]:
        def work():
            with self._lock:
                return self._generate_isolated(jobs)

        # a worker thread keeps the event loop (health checks, queueing) responsive
        outs = await asyncio.to_thread(work)
        self._inferences += len(jobs)
        self._executions += 1
        return outs

    async def _run_continuous(self, job: Job) -> Result:
        """One job through the engine; a token-id prompt's stop strings cut it afterwards,
        as `generate_ids` does on the batch path."""
        assert self._engine is not None and job.prompt_ids is not None
        by_ids = not isinstance(job.prompt, str)
        params = job.params.model_copy(update={"stop": []}) if by_ids else job.params
        end = await complete(self._engine, job.prompt_ids, params)
        self._inferences += 1
        if by_ids:
            return self._result_from_ids(job, end.token_ids)
        text = end.text if end.text is not None else self.generator.decode(end.token_ids)
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
        from kiln.serving.generate import _hold_back

        assert self._engine is not None and job.prompt_ids is not None
        decode, sent = self.generator.decode, ""
        text_so_far = IncrementalText(decode)
        async for event in stream_events(self._engine, job.prompt_ids, job.params):
            if event.kind == "finish":
                self._inferences += 1
                end = event.text if event.text is not None else decode(event.token_ids)
                if len(end) > len(sent):
                    yield end[len(sent) :]
                return
            text = _hold_back(text_so_far.update(event.token_ids), job.params.stop)
            if len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent) :]
                sent = text

    def _generate_isolated(self, jobs: list[Job]) -> list[Result | Exception]:
        try:
            return list(self._generate(jobs))
        except Exception as e:  # noqa: BLE001 - find the job that fails, spare the others
            if len(jobs) == 1:
                log.warning("generation failed: %s", e)
                return [e]
        outs: list[Result | Exception] = []
        for job in jobs:
            outs += self._generate_isolated([job])
        return outs

    def _generate(self, jobs: list[Job]) -> list[Result]:
        """Text prompts through `generate` (stop strings end them early); token-id prompts
        through `generate_ids`, with stop strings applied to the decoded text afterwards."""
        out: list[Result | None] = [None] * len(jobs)
        text = [i for i, j in enumerate(jobs) if isinstance(j.prompt, str)]
        ids = [i for i, j in enumerate(jobs) if not isinstance(j.prompt, str)]
        if text:
            done = self.generator.generate(
                [jobs[i].prompt for i in text], [jobs[i].params for i in text]
            )
            for i, c in zip(text, done, strict=True):
                cut = c.finish_reason == "stop" and self._has_stop(c.token_ids, jobs[i].params.stop)
                out[i] = Result(
                    c.text,
                    c.finish_reason,
                    c.prompt_tokens,
                    c.completion_tokens,
                    jobs[i].prompt_ids,
                    c.token_ids,
                    ended_by_eos=c.finish_reason == "stop" and not cut,
                )
        if ids:
            done_ids = self.generator.generate_ids(
                [jobs[i].prompt_ids for i in ids], [jobs[i].params for i in ids]
            )
            for i, new in zip(ids, done_ids, strict=True):
                out[i] = self._result_from_ids(jobs[i], new)
        return out  # type: ignore[return-value]

    def _result_from_ids(self, job: Job, new: list[int]) -> Result:
        """What `generate` would have returned: cut at the first stop string, finish reason."""
        prompt_ids = job.prompt_ids or []
        decode = self.generator.decode
        if job.params.stop:
            for k in range(1, len(new) + 1):
                text = decode(new[:k])
                cuts = [c for c in (text.find(s) for s in job.params.stop) if c >= 0]
                if cuts:
                    return Result(
                        text[: min(cuts)], "stop", len(prompt_ids), k, prompt_ids, new[:k]
                    )
        full = len(new) >= job.params.max_new_tokens or (
            len(prompt_ids) + len(new) >= self.generator.max_seq_len
        )
        reason = "length" if full else "stop"
        return Result(decode(new), reason, len(prompt_ids), len(new), prompt_ids, new, not full)

    def _has_stop(self, token_ids: list[int], stops: list[str]) -> bool:
        text = self.generator.decode(token_ids) if stops else ""
        return any(s in text for s in stops)

    async def stream(self, job: Job) -> AsyncIterator[str]:
        if self._engine is not None and isinstance(job.prompt, str):
            async for delta in self._stream_continuous(job):
                yield delta
            return
        if not isinstance(job.prompt, str):  # token ids: one delta with the whole text
            (result,) = await self.complete([job])
            yield result.text
            return
        it = self.generator.stream(job.prompt, job.params)
        done = object()

        def step():
            with self._lock:
                return next(it, done)

        while True:
            delta = await asyncio.to_thread(step)
            if delta is done:
                return
            yield delta

    # ---- log-probabilities --------------------------------------------------------------

    async def score(self, ids: list[int], top: int) -> list[TokenScore]:
        from kiln.serving.logprobs import score_tokens

        def work():
            with self._lock:
                return score_tokens(self.generator.model, ids, top)

        return await asyncio.to_thread(work)

    def token_texts(self, ids: list[int]) -> list[str]:
        tok = self.generator.tokenizer
        return [tok.decode([i], skip_special_tokens=False) for i in ids]

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        from kiln.serving.logprobs import token_bytes

        return [token_bytes(self.generator.tokenizer, i) for i in ids]

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        executions = self._executions if self._engine is None else self._engine.steps
        return {"inference_count": self._inferences, "execution_count": executions}

    async def close(self) -> None:
        if self._engine is not None:
            await asyncio.to_thread(self._engine.stop)
