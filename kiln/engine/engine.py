"""The continuous-batching step loop on a background thread.

    engine = Engine(generator, max_slots=16, prefill_chunk=256).start()  # a background thread
    request = engine.submit(prompt_ids, SamplingParams(max_new_tokens=32), listener)
    ...
    engine.stop()

The keys/values live in a paged cache (fixed-size blocks, a block table per sequence) with
automatic prefix caching: a prompt whose leading full blocks some earlier request computed
(a shared system prompt, the previous turn of a chat, a sibling of `n > 1`) starts from them.
Each iteration the scheduler (scheduler.py) picks decoding rows, prompt chunks and new requests
within a token budget and the free blocks, preempting the newest request (to be recomputed)
when blocks run out. Decoding rows and prompt chunks run side by side in one packed forward
with no pads (kiln/model/packed_batch.py: attention per prompt chunk and per run of decoding
rows); steps with LoRA rows, MLA models and a failed packed forward run prompt chunks as
right-padded forwards of similar lengths, then one [rows, 1] decode forward. Each row is
sampled with its own parameters and seed. A request that arrives while others decode joins at
the next iteration. Errors are caught per request: a prefill or sampling failure fails that
request only. torch releases the GIL in its kernels, so the submitting (asyncio) thread stays
responsive.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
from collections.abc import Collection, Iterator
from contextlib import nullcontext
from typing import Any, Protocol

import torch
from torch import nn

from kiln.engine.grammar import GrammarCompiler
from kiln.engine.kv_cache_manager import DEFAULT_BLOCK_SIZE, KVCacheManager, blocks_for
from kiln.engine.lora_registry import DEFAULT_MAX_LORA_RANK, LoRARegistry
from kiln.engine.model_runner import ModelRunner, decodes_in_place
from kiln.engine.request import EngineRequest, Listener
from kiln.engine.sampler import SamplingParams, make_generator, sample_tokens
from kiln.engine.scheduler import Plan, Scheduler
from kiln.engine.sequence import Sequence, StopRule
from kiln.engine.speculative import SpeculativeDecoder
from kiln.engine.speculative_config import SpeculativeConfig
from kiln.model.paged_kv_cache import PagedKVCache
from kiln.platform.errors import InputError

log = logging.getLogger("kiln")

_STOP = object()


class EngineStopped(RuntimeError):
    """The engine stopped before this request finished."""


class DecodingTarget(Protocol):
    """What the engine decodes for (a `Generator`): the model, where it runs, its context and
    its tokenizer's end-of-text ids and decode (stop strings are matched on text)."""

    model: nn.Module
    device: torch.device
    max_seq_len: int
    eos_token_ids: Collection[int]
    tokenizer: Any  # a `tokenizers.Tokenizer`: structured output compiles grammars over it

    def decode(self, ids: list[int]) -> str: ...


class Engine:
    """`step()` = schedule (admission, prefill chunks, decode rows) -> run the model -> update
    each request (sample, stop, notify)."""

    def __init__(
        self,
        target: DecodingTarget,
        *,
        max_slots: int = 16,
        prefill_chunk: int = 256,
        max_num_batched_tokens: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_blocks: int | None = None,
        kv_cache_memory: int | None = None,
        enable_prefix_caching: bool = True,
        speculative: SpeculativeConfig | None = None,
        draft_model: nn.Module | None = None,
        max_loras: int = 0,
        max_lora_rank: int = DEFAULT_MAX_LORA_RANK,
        lock: threading.Lock | None = None,
    ) -> None:
        """`max_slots`: sequences running at once (vLLM's max_num_seqs). Tokens computed per
        step: `max_num_batched_tokens`, by default `prefill_chunk` beyond one per running
        sequence. KV blocks: `num_blocks`, else `kv_cache_memory` bytes' worth, else enough for
        `max_slots` full contexts up to 4 GiB (kv_cache_manager.blocks_for). `max_loras` > 0
        serves LoRA adapters (`self.loras`), that many at once in a forward, of rank up to
        `max_lora_rank`. `speculative`: speculative decoding (speculative.py); `draft_model` a
        built draft model for it."""
        if max_slots < 1 or prefill_chunk < 1 or block_size < 1:
            raise InputError("engine: max_slots, prefill_chunk and block_size must be >= 1")
        model = target.model
        self.device = target.device
        self.target = target
        self._grammars: GrammarCompiler | None = None
        self.max_len = min(target.max_seq_len, model.cfg.max_seq_len)
        self.stop_rule = StopRule(target.eos_token_ids, target.max_seq_len, target.decode)
        dtype = model.tok_embeddings.weight.dtype
        if num_blocks is None:
            num_blocks = blocks_for(
                model.cfg, max_slots, self.max_len, block_size, dtype, kv_cache_memory
            )
        elif (num_blocks - 1) * block_size < self.max_len:
            raise InputError(
                f"engine: {num_blocks} KV blocks of {block_size} tokens cannot hold one "
                f"{self.max_len}-token context (one block is reserved)"
            )
        cache = PagedKVCache.for_model(
            model.cfg, num_blocks, block_size, dtype=dtype, device=self.device
        )
        self.kv = KVCacheManager(cache, enable_prefix_caching=enable_prefix_caching)
        budget = max_num_batched_tokens or prefill_chunk + max_slots
        self.loras = LoRARegistry(model, max_loras, max_lora_rank) if max_loras else None
        can_run = self.loras.admit if self.loras is not None else None
        self.scheduler = Scheduler(self.kv, max_slots, budget, self.max_len, can_run)
        self._forward = ModelRunner(model)
        self._in_place = decodes_in_place(model, cache)  # PackedBatch's `in_place`
        self._mla = getattr(model.cfg, "mla", None) is not None  # caches a latent: padded path
        self.speculator = (
            SpeculativeDecoder(
                speculative,
                kv=self.kv,
                forward=self._forward,
                stop_rule=self.stop_rule,
                max_len=self.max_len,
                target=model,
                draft_model=draft_model,
            )
            if speculative is not None
            else None
        )
        self.steps = 0  # iterations that ran a forward
        self.prefill_forwards = 0  # prefill forwards, and the prompt chunks they carried
        self.prefill_chunks = 0
        self._lock = lock or nullcontext()
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    # ---- any thread ------------------------------------------------------------------------

    def start(self) -> Engine:
        if self._thread is None or not self._thread.is_alive():
            # torch's intra-op thread count is process-wide: the engine thread uses the caller's
            cache, sched = self.kv.cache, self.scheduler
            log.info(
                "engine: up to %d sequences of up to %d tokens, %d KV blocks of %d tokens, "
                "prefix caching %s, %d tokens/step, torch threads %d",
                sched.max_num_seqs,
                self.max_len,
                cache.num_blocks - 1,
                cache.block_size,
                "on" if self.kv.enable_prefix_caching else "off",
                sched.max_num_batched_tokens,
                torch.get_num_threads(),
            )
            self._thread = threading.Thread(target=self._run, name="kiln-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout)

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        listener: Listener,
        *,
        cache_salt: str | None = None,
        lora: str | None = None,
    ) -> EngineRequest:
        """Queue one sequence; `listener` gets its events on the engine thread. Raises
        InputError here (nothing queued) for an empty prompt, one that fills the context, or a
        grammar that cannot be built.
        Token ids are the caller's to check (LocalBackend.prepare does): one outside the
        vocabulary fails its own prefill, and only that request. Requests share cached
        prefixes only with requests of the same `cache_salt` (a tenant) and LoRA adapter `lora`
        (a name in `self.loras`; None: the base model)."""
        adapter = None
        if lora is not None:
            if self.loras is None:
                raise InputError(f"model: {lora!r} names a LoRA adapter; this engine serves none")
            adapter = self.loras.get(lora)
            # both parts encoded: no tenant's salt can spell an adapter's key
            cache_salt = json.dumps([adapter.cache_key, cache_salt])
        elif cache_salt is not None:
            cache_salt = json.dumps([None, cache_salt])
        ids = list(prompt_ids)
        if not ids:
            raise InputError("prompt: no tokens")
        if len(ids) >= self.max_len:
            raise InputError(f"prompt has {len(ids)} tokens; the model's context is {self.max_len}")
        seq = Sequence(ids, params, make_generator(params, self.device))
        if params.grammar is not None:
            seq.grammar = self.grammars.matcher(params.grammar)
        request = EngineRequest(seq, listener, cache_salt=cache_salt, lora=adapter)
        self._inbox.put(request)
        return request

    @property
    def grammars(self) -> GrammarCompiler:
        """Grammars over the target's tokenizer, built at the first structured request."""
        if self._grammars is None:
            vocab = int(self.target.model.tok_embeddings.weight.shape[0])
            self._grammars = GrammarCompiler(
                self.target.tokenizer, self.target.eos_token_ids, vocab
            )
        return self._grammars

    def cancel(self, request: EngineRequest) -> None:
        request.cancelled = True  # the loop frees its blocks at the next iteration

    def run(self, requests: list[EngineRequest]) -> Iterator[None]:
        """Step on this thread until `requests` finish, yielding after each step: the offline
        `Generator`'s loop (a started engine steps on its own thread instead). A failing
        forward raises here."""
        self._take(block=False)
        while not all(r.finished for r in requests):
            with torch.inference_mode():
                self.step()
            self._retire()
            yield

    # ---- the engine thread -----------------------------------------------------------------

    def _run(self) -> None:
        sched = self.scheduler
        while True:
            if not self._take(block=sched.idle):
                break
            try:
                with self._lock, torch.inference_mode():
                    self.step()
            except Exception as e:  # noqa: BLE001 - a failed shared forward: its rows fail
                log.warning("engine step failed: %s", e)
                for request in sched.running:
                    if not request.finished:
                        request.fail(e)
            self._retire()
        stopped = EngineStopped("the engine stopped")
        for request in [*sched.running, *sched.waiting]:
            if not request.finished:
                request.fail(stopped)

    def _take(self, block: bool) -> bool:
        """Move submitted requests to the scheduler; False when asked to stop."""
        try:
            item = self._inbox.get(block=block)
            while True:
                if item is _STOP:
                    return False
                self._enqueue(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _enqueue(self, request: EngineRequest) -> None:
        if request.seq.params.max_new_tokens == 0:
            request.seq.finish_reason = "length"
            request.emit("finish")
        else:
            self.scheduler.add(request)

    def step(self) -> None:
        """One iteration: schedule, the prompt chunks' forwards, one decode forward, notify."""
        sched = self.scheduler
        plan = sched.schedule()
        # a prompt's tokens (even a lone one) run in prefill forwards, whose failures are
        # retried request by request; decode rows are past their prompt
        decoding = [(r, n) for r, n in plan if n == 1 and r.computed >= len(r.prompt_ids)]
        prompts = [(r, n) for r, n in plan if n > 1 or r.computed < len(r.prompt_ids)]
        if decoding and self.speculator is not None:
            decoding = self.speculator.decode(decoding)  # the rows it did not take
        if not (self._packable(decoding + prompts) and self._packed(decoding, prompts)):
            for group in sched.prefill_groups(prompts):
                self._prefill(group)
            if decoding:
                self._decode(decoding)
        self.steps += bool(plan)

    def _packable(self, work: Plan) -> bool:
        """Whether this step's work can run as one packed forward: some work, a model whose
        attention caches keys and values (not MLA's latent), no LoRA adapter among its rows
        (adapters are applied per batch row)."""
        if not work or self._mla:
            return False
        return self.loras is None or all(r.lora is None for r, _ in work)

    def _packed(self, decoding: Plan, prompts: Plan) -> bool:
        """Decoding rows and prompt chunks in one forward without pads (PackedBatch): the
        weights are read once per step and no pad token is computed. False, with nothing
        computed, when that forward fails: the step then runs as separate forwards, which
        isolate a failing request."""
        decoding = sorted(decoding, key=lambda item: -item[0].computed)  # padding-bounded runs
        try:
            self._run_chunks(decoding + prompts, packed=True)
        except Exception as e:  # noqa: BLE001 - retried by the separate forwards
            log.debug("packed forward failed (%s); retrying as separate forwards", e)
            return False
        if prompts:
            self.prefill_forwards += 1
            self.prefill_chunks += len(prompts)
        return True

    def _retire(self) -> None:
        self.scheduler.retire()
        if self.speculator is not None:
            self.speculator.release_finished()

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (call after changing the model's weights in place);
        returns how many blocks were cached. Engine thread, or while the engine is stopped."""
        return self.kv.reset_prefix_cache()

    def stats(self) -> dict[str, Any]:
        """Prefix-cache and KV-block counts, and speculative decoding's when it is on (vLLM's
        names without the prefix)."""
        kv, sched = self.kv, self.scheduler
        spec = self.speculator.stats.as_dict() if self.speculator is not None else {}
        return {
            **spec,
            "prefix_cache_queries": kv.stats.queries,
            "prefix_cache_hits": kv.stats.hits,
            "prefix_cache_hit_rate": kv.stats.hit_rate,
            "num_preemptions": kv.stats.preemptions,
            "kv_cache_usage_perc": kv.usage,
            "kv_blocks_total": kv.pool.num_blocks,
            "kv_blocks_free": kv.num_free,
            "kv_blocks_cached": kv.pool.num_cached,
            # a finished request stays in `running` until the step that answered it retires it
            "num_requests_running": sum(not r.finished for r in list(sched.running)),
            "num_requests_waiting": len(sched.waiting),
            **(self.loras.stats() if self.loras is not None else {}),
        }

    def _prefill(self, group: Plan) -> None:
        """Compute one chunk of each request's tokens in one forward; a failing forward is
        retried one request at a time, so only a request that fails alone gets the error."""
        try:
            self._run_chunks(group)
        except Exception as e:  # noqa: BLE001 - this group's requests only
            if len(group) == 1:
                log.warning("prefill failed: %s", e)
                group[0][0].fail(e)
                return
            for item in group:
                self._prefill([item])

    def _decode(self, rows: Plan) -> None:
        """Every decoding row's last token in one [rows, 1] forward."""
        self._run_chunks(rows)

    def _run_chunks(self, group: Plan, packed: bool = False) -> None:
        """One forward over each request's next `n` tokens, read and written through the
        requests' block tables: right-padded to the longest ([rows, width]), or `packed` side by
        side in one row ([1, sum n], no LoRA rows); logits (and a sampled token) for the
        requests whose chunk reaches their last token. A request's computed count advances
        only after the forward succeeded."""
        if self.loras is not None and not packed:  # each adapter's rows side by side: slices
            group = sorted(group, key=lambda item: item[0].lora.uid if item[0].lora else 0)
        kv = self.kv
        tables = [kv.block_ids(r) for r, _ in group]
        lengths = [r.computed for r, _ in group]
        chunks = [r.all_ids[r.computed : r.computed + n] for r, n in group]
        ending = [row for row, (r, n) in enumerate(group) if r.uncomputed == n]
        if packed:
            tokens = torch.tensor([[t for chunk in chunks for t in chunk]], dtype=torch.long)
            counts = [n for _, n in group]
            batch = kv.cache.packed(tables, lengths, counts, in_place=self._in_place)
            last = list(itertools.accumulate(counts))
            logits = self._forward(
                tokens.to(self.device), batch, [0] * len(ending), [last[r] - 1 for r in ending]
            )
        else:
            width = max(n for _, n in group)
            tokens = torch.tensor([c + [0] * (width - len(c)) for c in chunks], dtype=torch.long)
            batch = kv.cache.batch(tables, lengths, width)
            cols = [group[row][1] - 1 for row in ending]
            rows = [r for r, _ in group]
            with self.loras.rows(rows, self.device) if self.loras is not None else nullcontext():
                logits = self._forward(tokens.to(self.device), batch, ending, cols)
            if width > 1:
                self.prefill_forwards += 1
                self.prefill_chunks += len(group)
        for request, n in group:
            kv.commit(request, n)
        if ending:
            self._sample([group[row][0] for row in ending], logits)

    def _sample(self, rows: list[EngineRequest], logits: torch.Tensor) -> None:
        """Each row's next token with its own parameters; a row that cannot be sampled fails
        alone (the batch is retried row by row)."""
        seqs = [r.seq for r in rows]
        try:
            tokens = self._sample_rows(seqs, logits)
        except Exception:  # noqa: BLE001 - find the failing row(s)
            tokens = []
            for i, request in enumerate(rows):
                try:
                    tokens += self._sample_rows([seqs[i]], logits[i : i + 1])
                except Exception as e:  # noqa: BLE001
                    request.fail(e)
                    tokens.append(None)
        for request, token in zip(rows, tokens, strict=True):
            if token is None or request.finished:
                continue
            try:
                self.stop_rule.push(request.seq, token)
            except InputError as e:  # its grammar allows no token here: this request only
                request.fail(e)
                continue
            request.emit("finish" if request.seq.done else "token")

    @staticmethod
    def _sample_rows(seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        return sample_tokens(
            logits,
            [s.params for s in seqs],
            [s.rng for s in seqs],
            [(s.prompt_ids, s.token_ids) for s in seqs],
            [s.grammar for s in seqs],
        )
