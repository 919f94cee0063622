"""Iteration-level scheduling over the paged KV cache, as vLLM's v1 scheduler: every step gets a
token budget (`max_num_batched_tokens`) and at most `max_num_seqs` running sequences; running
requests are served first (decoding rows, then prompt chunks), waiting ones join while budget and
KV blocks last. When a running request cannot get a block, the most recently admitted request is
preempted: its blocks are freed and it waits at the head of the queue to be recomputed (its
prefix, still cached unless evicted, comes back as a cache hit). Pure bookkeeping (no torch)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from kiln.engine.kv_cache_manager import KVCacheManager
from kiln.engine.request import EngineRequest

Plan = list[tuple[EngineRequest, int]]  # (request, tokens it computes this step)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_len: int,
        can_run: Callable[[EngineRequest, list[EngineRequest]], bool] | None = None,
    ) -> None:
        """`can_run(request, running)`: whatever else a waiting request needs before it runs
        beside `running` (its LoRA adapter a slot, lora_batch.py); False keeps it waiting."""
        self.kv = kv
        self.can_run = can_run
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_len = max_len
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []  # in admission order (the last is preempted first)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, request: EngineRequest) -> None:
        self.waiting.append(request)

    def schedule(self) -> Plan:
        """This step's work: decoding rows first, then running prompts' chunks, then admissions
        (none in a step that had to preempt)."""
        budget = self.max_num_batched_tokens
        plan: Plan = []
        planned: set[int] = set()
        preempted = False
        live = [r for r in self.running if not r.finished]
        for request in sorted(live, key=lambda r: r.uncomputed != 1):
            if budget <= 0:
                break
            if request not in self.running:  # preempted earlier in this step
                continue
            n = min(request.uncomputed, budget)
            kept, evicted = self._allocate_or_preempt(request, n, planned)
            preempted |= evicted
            if kept:
                plan.append((request, n))
                planned.add(request.id)
                budget -= n
        if not preempted:
            self._admit(plan, budget)
        return plan

    def _allocate_or_preempt(
        self, request: EngineRequest, n: int, planned: set[int]
    ) -> tuple[bool, bool]:
        """Blocks for `n` tokens of a running request, preempting the newest running requests
        not already in this step's plan while the pool is short (`request` itself when it is
        the newest). Returns (request keeps running, something was preempted)."""
        evicted = False
        while not self.kv.allocate(request, n):
            # the newest request not already planned (`request` itself is one of them)
            victim = next(
                r for r in reversed(self.running) if not r.finished and r.id not in planned
            )
            self._preempt(victim)
            evicted = True
            if victim is request:
                return False, True
        return True, evicted

    def _preempt(self, request: EngineRequest) -> None:
        self.kv.free(request)
        self.kv.stats.preemptions += 1
        self.running.remove(request)
        self.waiting.appendleft(request)

    def _admit(self, plan: Plan, budget: int) -> None:
        """Oldest waiting requests first, each with its cached prefix, while the budget, the
        sequence cap and free blocks allow; one whose next block another request is computing
        right now waits a step for it to be cached. One `can_run` refuses (its LoRA adapter has
        no slot) is passed over, keeping its place, as vLLM's scheduler skips it."""
        kv, inflight, passed = self.kv, None, []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.finished:
                self.waiting.popleft()
                continue
            if self.can_run is not None and not self.can_run(request, self.running):
                passed.append(self.waiting.popleft())
                continue
            hit = kv.cached_prefix(request)
            if kv.enable_prefix_caching:
                if inflight is None:
                    inflight = kv.inflight(self.running)
                following = kv.hashes(request, len(hit) + 1)
                if len(following) > len(hit) and following[-1] in inflight:
                    break
            n = min(request.num_tokens - len(hit) * kv.block_size, budget)
            if not kv.allocate(request, n, hit):
                break
            kv.count_admission(request, hit)
            self.waiting.popleft()
            self.running.append(request)
            plan.append((request, n))
            budget -= n
            if inflight is not None:
                inflight |= kv.inflight([request])
        self.waiting.extendleft(reversed(passed))

    def prefill_groups(self, plan: Plan) -> list[Plan]:
        """Split the multi-token chunks of a plan into forwards: chunks right-padded to the
        group's longest, a chunk joining only while it is at least half that long (padding stays
        under half the work) and its row has room in the context for the pads; any other chunk
        runs alone."""
        groups: list[Plan] = []
        for request, n in sorted(plan, key=lambda item: -item[1]):
            group = groups[-1] if groups else None
            if (
                group is not None
                and 2 * n >= group[0][1]
                and request.computed + group[0][1] <= self.max_len
            ):
                group.append((request, n))
            else:
                groups.append([(request, n)])
        return groups

    def retire(self) -> list[EngineRequest]:
        """Free the blocks of finished, failed or cancelled requests; returns them."""
        done = [r for r in self.running if r.finished]
        for request in done:
            self.kv.free(request)
        self.running = [r for r in self.running if not r.finished]
        self.waiting = deque(r for r in self.waiting if not r.finished)
        return done
