"""Drafting with a smaller model (vLLM's `draft_model` method): the draft model has its own
paged KV cache and block pool, and each request its own draft blocks and count of draft tokens
computed. A step catches the draft up on the tokens the target accepted since its last step
(the whole prompt, the first time), then decodes k tokens autoregressively, all rows batched;
after verification the draft's count is rolled back to the tokens both models agree on and its
blocks past them are freed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch import nn

from kiln.engine.block_pool import BlockPool, KVBlock
from kiln.engine.model_runner import ModelRunner
from kiln.engine.rejection_sampler import draw_draft
from kiln.engine.request import EngineRequest
from kiln.model.formats.weights import build_model, read_weights
from kiln.model.paged_kv_cache import PagedKVCache
from kiln.platform.errors import InputError

Draft = tuple[list[int], list[torch.Tensor | None]]  # tokens, and the q each was drawn from


def load_draft_model(path: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A draft model from an exported model, HF or kiln checkpoint directory."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise InputError(f"speculative.model: {path}: no such model directory")
    _, cfg, state = read_weights(path)
    return build_model(cfg, state, device=device, dtype=dtype)


@dataclass
class DraftState:
    blocks: list[KVBlock] = field(default_factory=list)
    computed: int = 0  # leading tokens of the request whose draft keys/values are cached


class DraftModelProposer:
    def __init__(
        self, model: nn.Module, *, num_blocks: int, block_size: int, vocab_size: int
    ) -> None:
        draft_vocab = int(model.tok_embeddings.weight.shape[0])
        if draft_vocab != vocab_size:
            raise InputError(
                f"speculative.model: its vocabulary has {draft_vocab} tokens, the served "
                f"model's {vocab_size}; a draft model must share the tokenizer"
            )
        weight = model.tok_embeddings.weight
        self.model = model.eval()
        self.max_len = model.cfg.max_seq_len
        self.cache = PagedKVCache.for_model(
            model.cfg, num_blocks, block_size, dtype=weight.dtype, device=weight.device
        )
        self.pool = BlockPool(num_blocks)
        self._forward = ModelRunner(model)
        self.states: dict[int, tuple[EngineRequest, DraftState]] = {}

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    def propose(self, requests: list[EngineRequest], ks: list[int], catch_up: int) -> list[Draft]:
        """Up to ks[i] draft tokens for each request (none where the draft pool is short).
        Catch-up chunks of at most `catch_up` tokens share a forward; longer ones (a prompt)
        run alone."""
        rows: list[tuple[EngineRequest, DraftState, int]] = []
        for request, k in zip(requests, ks, strict=True):
            state = self._state(request)
            state.computed = min(state.computed, request.num_tokens - 1)  # feed >= 1 token
            if self._hold(state, request.num_tokens + k - 1):
                rows.append((request, state, k))
        drafts: dict[int, Draft] = {request.id: ([], []) for request in requests}
        if not rows:
            return [drafts[r.id] for r in requests]
        short = [row for row in rows if row[0].num_tokens - row[1].computed <= catch_up]
        long = [row for row in rows if row[0].num_tokens - row[1].computed > catch_up]
        for group in [[row] for row in long] + ([short] if short else []):
            feeds = [request.all_ids[state.computed :] for request, state, _ in group]
            logits = self._run(feeds, [state for _, state, _ in group])
            self._draw(group, logits, drafts)
        for j in range(1, max(k for _, _, k in rows)):
            group = [row for row in rows if row[2] > j]
            feeds = [[drafts[request.id][0][-1]] for request, _, _ in group]
            logits = self._run(feeds, [state for _, state, _ in group])
            self._draw(group, logits, drafts)
        return [drafts[r.id] for r in requests]

    def rollback(self, request: EngineRequest, valid: int) -> None:
        """Keep the draft's keys/values of the request's first `valid` tokens only (the rest
        were rejected drafts), and free its blocks past them."""
        entry = self.states.get(request.id)
        if entry is None:
            return
        state = entry[1]
        state.computed = min(state.computed, valid)
        keep = -(-state.computed // self.block_size)
        if len(state.blocks) > keep:
            self.pool.release(reversed(state.blocks[keep:]))
            del state.blocks[keep:]

    def release_finished(self) -> None:
        """Free the draft blocks of requests that finished, failed or were cancelled."""
        for rid, (request, state) in list(self.states.items()):
            if request.finished:
                self.pool.release(reversed(state.blocks))
                del self.states[rid]

    @property
    def blocks_held(self) -> int:
        return sum(len(state.blocks) for _, state in self.states.values())

    # ---- internals -----------------------------------------------------------------------

    def _state(self, request: EngineRequest) -> DraftState:
        entry = self.states.get(request.id)
        if entry is None:
            entry = self.states[request.id] = (request, DraftState())
        return entry[1]

    def _hold(self, state: DraftState, tokens: int) -> bool:
        """Blocks for the first `tokens` tokens; False (holding nothing new) when short."""
        need = -(-tokens // self.block_size) - len(state.blocks)
        if need > self.pool.num_free:
            return False
        if need > 0:
            state.blocks.extend(self.pool.take(need))
        return True

    def _run(self, feeds: list[list[int]], states: list[DraftState]) -> torch.Tensor:
        """One draft forward over each row's `feeds` (right-padded); logits [rows, V] at each
        row's last fed token. The rows' computed counts advance."""
        width = max(len(f) for f in feeds)
        tokens = torch.zeros(len(feeds), width, dtype=torch.long)
        for row, feed in enumerate(feeds):
            tokens[row, : len(feed)] = torch.tensor(feed)
        batch = self.cache.batch(
            [[b.id for b in s.blocks] for s in states], [s.computed for s in states], width
        )
        device = self.model.tok_embeddings.weight.device
        logits = self._forward(
            tokens.to(device), batch, list(range(len(feeds))), [len(f) - 1 for f in feeds]
        )
        for feed, state in zip(feeds, states, strict=True):
            state.computed += len(feed)
        return logits

    @staticmethod
    def _draw(group, logits: torch.Tensor, drafts: dict[int, Draft]) -> None:
        for row, (request, _, _) in enumerate(group):
            token, q = draw_draft(logits[row], request.seq.params, request.seq.rng)
            tokens, probs = drafts[request.id]
            tokens.append(token)
            probs.append(q)
