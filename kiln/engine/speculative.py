"""Speculative decoding in the engine's decode step. For each decoding row a drafter
(prompt lookup, ngram_proposer.py, or a draft model, draft_model.py) proposes up to k tokens;
one target forward over the row's last token and its drafts (k + 1 positions, every row
right-padded to the longest) gives the logits at each position; rejection_sampler.py keeps the
drafts the target agrees with and adds one token of the target's own, so a row gains 1 to k + 1
tokens per forward. The keys/values of rejected drafts are rolled back: the row's computed
count stops after the kept tokens and its blocks past them go back to the pool (the draft
model's likewise).

Rows under a grammar or with penalties (whose distributions depend on every previous token in
ways the verifier does not replay), rows of a LoRA adapter (verified by the base model's forward
otherwise), rows whose drafter finds nothing, and rows too near their
context's end or their `max_new_tokens` decode as usual, in the same step. Draft tokens are
computed beyond the scheduler's token budget, and only into blocks the pool can spare: a row
that cannot get them drafts fewer tokens (never preempting anyone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from kiln.engine.draft_model import Draft, DraftModelProposer, load_draft_model
from kiln.engine.kv_cache_manager import KVCacheManager
from kiln.engine.ngram_proposer import NgramProposer
from kiln.engine.rejection_sampler import verify_greedy, verify_sampled
from kiln.engine.request import EngineRequest
from kiln.engine.sequence import StopRule
from kiln.engine.speculative_config import SpeculativeConfig

log = logging.getLogger("kiln")

LOG_INTERVAL_S = 10.0  # as vLLM's periodic "SpecDecoding metrics" line

Plan = list[tuple[EngineRequest, int]]
Forward = Callable[[torch.Tensor, object, list[int], list[int]], torch.Tensor]


@dataclass
class SpecDecodeStats:
    """vLLM's spec-decode counters: verification rows (drafts), tokens drafted, tokens
    accepted, and accepted tokens by position in the draft."""

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.num_speculative_tokens

    def observe(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for pos in range(accepted):
            self.accepted_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verification forward gives a row (1 + accepted drafts): the speed-up over
        plain decoding in target forwards, before the drafting's own cost."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def as_dict(self) -> dict:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
            "spec_decode_acceptance_rate": self.acceptance_rate,
            "spec_decode_mean_acceptance_length": self.mean_acceptance_length,
        }


class SpeculativeDecoder:
    def __init__(
        self,
        config: SpeculativeConfig,
        *,
        kv: KVCacheManager,
        forward: Forward,
        stop_rule: StopRule,
        max_len: int,
        target: nn.Module,
        draft_model: nn.Module | None = None,
    ) -> None:
        """`draft_model`: an already built draft model (else `config.model` is loaded)."""
        self.k = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size
        self.kv = kv
        self._forward = forward
        self.stop_rule = stop_rule
        self.max_len = max_len
        self.ngram: NgramProposer | None = None
        self.draft: DraftModelProposer | None = None
        weight = target.tok_embeddings.weight
        if config.method == "ngram":
            self.ngram = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        else:
            model = draft_model or load_draft_model(config.model, weight.device, weight.dtype)
            self.draft = DraftModelProposer(
                model,
                num_blocks=kv.cache.num_blocks,
                block_size=kv.block_size,
                vocab_size=int(weight.shape[0]),
            )
            self.max_len = min(max_len, self.draft.max_len)
        self.method = config.method
        self.stats = SpecDecodeStats(self.k)
        self._logged_at = time.monotonic()
        self._logged = (0, 0, 0)

    def decode(self, rows: Plan) -> Plan:
        """Speculate for the decoding rows that can; return the rest for plain decoding."""
        if self.disable_by_batch_size is not None and len(rows) >= self.disable_by_batch_size:
            return rows
        candidates, rest = [], []
        for request, n in rows:
            k = self._room(request)
            if k > 0:
                candidates.append((request, n, k))
            else:
                rest.append((request, n))
        drafts = self._propose([r for r, _, _ in candidates], [k for _, _, k in candidates])
        verify = []
        for (request, n, _), draft in zip(candidates, drafts, strict=True):
            tokens, probs = draft
            tokens = tokens[: self._fit(request, len(tokens))]
            if tokens:
                verify.append((request, tokens, probs[: len(tokens)]))
            else:
                rest.append((request, n))
                if self.draft is not None:
                    self.draft.rollback(request, request.computed)
        if verify:
            self._verify(verify)
            self._maybe_log()
        return rest

    def release_finished(self) -> None:
        if self.draft is not None:
            self.draft.release_finished()

    # ---- internals -----------------------------------------------------------------------

    def _room(self, request: EngineRequest) -> int:
        """Tokens this row may draft: 0 when it must decode plainly."""
        seq = request.seq
        if request.uncomputed != 1 or seq.grammar is not None or seq.params.penalized:
            return 0
        if request.lora is not None:  # the verify forward (and a draft) run the base model
            return 0
        # the widest verification forward reaches position num_tokens - 1 + k (pads included)
        if request.num_tokens + self.k > self.max_len:
            return 0
        return min(self.k, seq.params.max_new_tokens - len(seq.token_ids) - 1)

    def _propose(self, requests: list[EngineRequest], ks: list[int]) -> list[Draft]:
        if not requests:
            return []
        if self.draft is not None:
            return self.draft.propose(requests, ks, catch_up=self.k + 1)
        assert self.ngram is not None
        out = []
        for request, k in zip(requests, ks, strict=True):
            tokens = self.ngram.propose(request.all_ids, k)
            out.append((tokens, [None] * len(tokens)))
        return out

    def _fit(self, request: EngineRequest, drafted: int) -> int:
        """How many of `drafted` tokens the row can verify: blocks for them all when the pool
        has them, else as many as its held blocks have room for."""
        if drafted and self.kv.allocate(request, drafted + 1):
            return drafted
        room = len(request.blocks) * self.kv.block_size - request.computed - 1
        return max(0, min(drafted, room))

    def _verify(self, rows: list[tuple[EngineRequest, list[int], list]]) -> None:
        """One target forward over each row's last token and drafts; keep, emit, roll back."""
        width = 1 + max(len(tokens) for _, tokens, _ in rows)
        batch_tokens = torch.zeros(len(rows), width, dtype=torch.long)
        index_rows, index_cols = [], []
        for row, (request, tokens, _) in enumerate(rows):
            batch_tokens[row, : len(tokens) + 1] = torch.tensor(
                [request.all_ids[request.computed], *tokens]
            )
            index_rows += [row] * (len(tokens) + 1)
            index_cols += list(range(len(tokens) + 1))
        kv = self.kv
        batch = kv.cache.batch(
            [kv.block_ids(r) for r, _, _ in rows], [r.computed for r, _, _ in rows], width
        )
        device = kv.cache.device
        logits = self._forward(batch_tokens.to(device), batch, index_rows, index_cols)
        argmax = logits.float().argmax(dim=-1).tolist()  # the greedy rows' target tokens
        start = 0
        for request, tokens, probs in rows:
            end = start + len(tokens) + 1
            seq = request.seq
            if seq.params.greedy:
                out = verify_greedy(tokens, argmax[start:end])
            else:
                out = verify_sampled(tokens, logits[start:end], seq.params, seq.rng, probs)
            start = end
            self.stats.observe(len(tokens), len(out) - 1)
            self._accept(request, out)

    def _accept(self, request: EngineRequest, out: list[int]) -> None:
        """Push the kept tokens (stopping where the sequence ends), mark the keys/values of the
        fed token and the kept drafts computed, free the blocks past them."""
        seq, kv = request.seq, self.kv
        before = len(seq.token_ids)
        if not request.finished:  # cancelled meanwhile: nothing more to tell
            for token in out:
                self.stop_rule.push(seq, token)
                request.emit("finish" if seq.done else "token")
                if seq.done or request.finished:
                    break
        appended = len(seq.token_ids) - before
        # the fed token and the drafts now in the sequence (the last emitted token is not
        # computed yet: it is the next step's input)
        kv.commit(request, 1 + min(appended, len(out) - 1))
        keep = -(-request.computed // kv.block_size)
        if len(request.blocks) > keep:
            kv.pool.release(reversed(request.blocks[keep:]))
            del request.blocks[keep:]
        if self.draft is not None:
            self.draft.rollback(request, request.computed)

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_INTERVAL_S:
            return
        s = self.stats
        drafts, drafted, accepted = (
            s.num_drafts - self._logged[0],
            s.num_draft_tokens - self._logged[1],
            s.num_accepted_tokens - self._logged[2],
        )
        self._logged_at, self._logged = (
            now,
            (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens),
        )
        if not drafts:
            return
        per_pos = ", ".join(f"{n / s.num_drafts:.2f}" for n in s.accepted_per_pos)
        log.info(
            "speculative decoding (%s, k=%d): mean acceptance length %.2f tokens per target "
            "forward, acceptance rate %.1f%% (%d of %d drafted tokens); since start: %.2f, "
            "%.1f%%, per-position acceptance %s",
            self.method,
            self.k,
            1 + accepted / drafts,
            100 * accepted / max(drafted, 1),
            accepted,
            drafted,
            s.mean_acceptance_length,
            100 * s.acceptance_rate,
            per_pos,
        )
