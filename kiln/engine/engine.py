"""The continuous-batching step loop on a background thread.

    engine = Engine(generator, max_slots=16, prefill_chunk=256).start()  # a background thread
    request = engine.submit(prompt_ids, SamplingParams(max_new_tokens=32), listener)
    ...
    engine.stop()

Each iteration admits waiting requests into free KV-cache slots, prefills at most
`prefill_chunk` prompt tokens (one forward per request), then runs one decode forward over the
slots of every request whose prompt is cached ([rows, 1] tokens, each row at its own length),
samples each row with its own parameters and seed, and frees the slots of finished requests. A
request that arrives while others decode joins at the next iteration. Errors are caught per
request: a prefill or sampling failure fails that request only. torch releases the GIL in its
kernels, so the submitting (asyncio) thread stays responsive.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Collection, Iterator
from contextlib import nullcontext
from typing import Any, Protocol

import torch
from torch import nn

from kiln.engine.grammar import GrammarCompiler
from kiln.engine.kv_cache_manager import SlotPool
from kiln.engine.model_runner import ModelRunner
from kiln.engine.request import EngineRequest, Listener
from kiln.engine.sampler import SamplingParams, make_generator, sample_next
from kiln.engine.scheduler import Scheduler
from kiln.engine.sequence import Sequence, StopRule
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
        lock: threading.Lock | None = None,
    ) -> None:
        if max_slots < 1 or prefill_chunk < 1:
            raise InputError("engine: max_slots and prefill_chunk must be >= 1")
        model = target.model
        self.device = target.device
        self.target = target
        self.stop_rule = StopRule(target.eos_token_ids, target.max_seq_len, target.decode)
        self._grammars: GrammarCompiler | None = None
        self.pool = SlotPool(
            model.cfg,
            max_slots,
            target.max_seq_len,
            dtype=model.tok_embeddings.weight.dtype,
            device=self.device,
        )
        self.scheduler = Scheduler(self.pool, prefill_chunk)
        self._forward = ModelRunner(model)
        self._decode_tokens = torch.zeros(max_slots, 1, dtype=torch.long, device=self.device)
        self.steps = 0  # iterations that ran a forward
        self.prefill_forwards = 0  # prefill forwards, and the prompt chunks they carried
        self.prefill_chunks = 0
        self.slot_moves = 0  # rows `_pack` moved to the front
        self._lock = lock or nullcontext()
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    # ---- any thread ------------------------------------------------------------------------

    def start(self) -> Engine:
        if self._thread is None or not self._thread.is_alive():
            # torch's intra-op thread count is process-wide: the engine thread uses the caller's
            log.info(
                "engine: %d KV-cache slots of up to %d tokens (%d allocated), prefill %d "
                "tokens/step, torch threads %d",
                self.pool.size,
                self.pool.max_len,
                self.pool.allocated,
                self.scheduler.prefill_chunk,
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
        self, prompt_ids: list[int], params: SamplingParams, listener: Listener
    ) -> EngineRequest:
        """Queue one sequence; `listener` gets its events on the engine thread. Raises
        InputError here (nothing queued) for an empty prompt, one that fills the context, or a
        grammar that cannot be built.
        Token ids are the caller's to check (LocalBackend.prepare does): one outside the
        vocabulary fails its own prefill, and only that request."""
        ids = list(prompt_ids)
        if not ids:
            raise InputError("prompt: no tokens")
        if len(ids) >= self.pool.max_len:
            raise InputError(
                f"prompt has {len(ids)} tokens; the model's context is {self.pool.max_len}"
            )
        seq = Sequence(ids, params, make_generator(params, self.device))
        if params.grammar is not None:
            seq.grammar = self.grammars.matcher(params.grammar)
        request = EngineRequest(seq, listener)
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
        request.cancelled = True  # the loop frees its slot at the next iteration

    def run(self, requests: list[EngineRequest]) -> Iterator[None]:
        """Step on this thread until `requests` finish, yielding after each step: the offline
        `Generator`'s loop (a started engine steps on its own thread instead). A failing
        forward raises here."""
        self._take(block=False)
        while not all(r.finished for r in requests):
            with torch.inference_mode():
                self.step()
            self.scheduler.retire()
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
            sched.retire()
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
        """One iteration: admit, prefill within the budget, one decode step, notify."""
        sched = self.scheduler
        sched.admit()
        plan = sched.prefill_plan()
        for group in sched.prefill_groups(plan):
            self._prefill(group)
        rows = sched.decode_rows()
        if rows:
            self._decode(rows)
        self.steps += bool(plan or rows)

    def _prefill(self, group: list[tuple[EngineRequest, int]]) -> None:
        """Cache one chunk of each request's prompt in one forward; a failing forward is
        retried one request at a time, so only a request that fails alone gets the error."""
        try:
            self._prefill_forward(group)
        except Exception as e:  # noqa: BLE001 - this group's requests only
            if len(group) == 1:
                log.warning("prefill failed: %s", e)
                group[0][0].fail(e)
                return
            for item in group:
                self._prefill([item])

    def _prefill_forward(self, group: list[tuple[EngineRequest, int]]) -> None:
        """Chunks right-padded to the longest, over the request's own slot (one request) or a
        gathered copy of the group's slots that is written back after the forward."""
        pool, device = self.pool, self.device
        slots: list[int] = [r.slot for r, _ in group]  # type: ignore[misc]
        width = max(n for _, n in group)
        tokens = torch.zeros(len(group), width, dtype=torch.long)
        for row, (request, n) in enumerate(group):
            start = request.prefilled
            tokens[row, :n] = torch.tensor(request.prompt_ids[start : start + n])
        single = len(group) == 1
        cache = pool.view(slots[0], slots[0] + 1, width) if single else pool.gather(slots, width)
        # logits only at the last prompt position of the chunks that end their prompt
        ending = [row for row, (r, n) in enumerate(group) if r.prefill_left == n]
        cols = [group[row][1] - 1 for row in ending]
        logits = self._forward(tokens.to(device), cache, ending, cols)
        self.prefill_forwards += 1
        self.prefill_chunks += len(group)
        if not single:
            pool.scatter(cache, slots)
        for request, n in group:
            pool.lengths[request.slot] += n  # type: ignore[index]
            request.prefilled += n
        if ending:  # those prompts are cached: their first tokens
            self._sample([group[row][0] for row in ending], logits)

    def _pack(self, rows: list[EngineRequest]) -> None:
        """Move the decoding rows into slots 0..len(rows)-1, swapping with whatever sits there
        (a free slot, a prompt mid-prefill, a finished request not yet retired): a slot freed
        mid-batch would otherwise keep every later decode step computing an idle row. A swap
        copies two rows once."""
        n = len(rows)
        holes = iter(sorted(set(range(n)) - {r.slot for r in rows}))
        owners = {r.slot: r for r in self.scheduler.running}
        for request in rows:
            if request.slot < n:  # type: ignore[operator]
                continue
            hole, here = next(holes), request.slot
            self.pool.swap(here, hole)  # type: ignore[arg-type]
            self.slot_moves += 1
            other = owners.get(hole)
            if other is not None:
                other.slot = here
            request.slot = hole

    def _decode(self, rows: list[EngineRequest]) -> None:
        """Feed every row its last token in one [rows, 1] forward over slots 0..len(rows)-1
        (`_pack` puts them there), each row at its own length."""
        device = self.device
        self._pack(rows)
        slots = [r.slot for r in rows]
        width = len(rows)
        tokens = self._decode_tokens[:width]  # allocated once
        tokens[slots, 0] = torch.tensor([r.seq.token_ids[-1] for r in rows], device=device)
        cache = self.pool.view(0, width, 1)
        logits = self._forward(tokens, cache, slots, [0] * len(slots))  # type: ignore[arg-type]
        for slot in slots:
            self.pool.lengths[slot] += 1  # type: ignore[index]
        self._sample(rows, logits)

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
        return sample_next(
            logits,
            [s.params for s in seqs],
            [s.rng for s in seqs],
            [(s.prompt_ids, s.token_ids) for s in seqs],
            [s.grammar for s in seqs],
        ).tolist()
