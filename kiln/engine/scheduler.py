"""Iteration-level scheduling: which requests hold a slot, which prompt chunks are prefilled and
which rows decode at the next step. Pure bookkeeping (no torch): the step loop runs the plan."""

from __future__ import annotations

from collections import deque

from kiln.engine.kv_cache_manager import SlotPool
from kiln.engine.request import EngineRequest


class Scheduler:
    """FIFO admission into a fixed slot pool. Every step, each running request whose prompt is
    cached decodes one token; prompts still to cache get at most `prefill_chunk` tokens in all
    (oldest first), so a long prompt is prefilled over several steps instead of stalling them."""

    def __init__(self, pool: SlotPool, prefill_chunk: int) -> None:
        self.pool = pool
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []  # hold a slot, in admission order

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, request: EngineRequest) -> None:
        self.waiting.append(request)

    def admit(self) -> None:
        """Give free slots to the oldest waiting requests (cancelled ones never take one)."""
        while self.waiting and self.pool.free:
            request = self.waiting.popleft()
            if request.finished:
                continue
            request.slot = self.pool.acquire()
            self.running.append(request)

    def prefill_plan(self) -> list[tuple[EngineRequest, int]]:
        """(request, tokens to cache now) within this step's prefill budget."""
        budget, plan = self.prefill_chunk, []
        for request in self.running:
            if budget <= 0:
                break
            if request.prefill_left and not request.finished:
                n = min(budget, request.prefill_left)
                plan.append((request, n))
                budget -= n
        return plan

    def prefill_groups(
        self, plan: list[tuple[EngineRequest, int]]
    ) -> list[list[tuple[EngineRequest, int]]]:
        """Split a plan into forwards: chunks right-padded to the group's longest, a chunk
        joining only while it is at least half that long (padding stays under half the work)
        and its row has room for the pads; any other chunk runs alone."""
        groups: list[list[tuple[EngineRequest, int]]] = []
        for request, n in sorted(plan, key=lambda item: -item[1]):
            group = groups[-1] if groups else None
            if (
                group is not None
                and 2 * n >= group[0][1]
                and self.pool.fits(request.slot, group[0][1])  # type: ignore[arg-type]
            ):
                group.append((request, n))
            else:
                groups.append([(request, n)])
        return groups

    def decode_rows(self) -> list[EngineRequest]:
        """Requests with their prompt cached and a token to feed: one decode step, by slot."""
        rows = [r for r in self.running if not r.prefill_left and not r.finished]
        return sorted(rows, key=lambda r: r.slot)  # type: ignore[arg-type, return-value]

    def retire(self) -> list[EngineRequest]:
        """Free the slots of finished, failed or cancelled requests; returns them."""
        done = [r for r in self.running if r.finished]
        for request in done:
            self.pool.release(request.slot)  # type: ignore[arg-type]
        self.running = [r for r in self.running if not r.finished]
        self.waiting = deque(r for r in self.waiting if not r.finished)
        return done
