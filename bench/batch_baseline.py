"""The request batcher that continuous batching is measured against (bench/serving_engine.py,
section 1): concurrent jobs gathered for `wait_s` by a `MicroBatcher` into one static batch,
completed by one `Generator.generate` call before the next batch starts."""

from __future__ import annotations

import asyncio

from bench.microbatcher import MicroBatcher
from kiln.serving.backends.backend import BatchingConfig, Job, Result
from kiln.serving.backends.local import LocalBackend


class BatchBackend(LocalBackend):
    """LocalBackend whose text jobs go through a MicroBatcher instead of the running engine."""

    def __init__(self, model_dir: str, model_name: str, max_batch_size: int, wait_s: float):
        super().__init__(model_dir, model_name, BatchingConfig(max_batch_size=1))
        self._batcher = MicroBatcher(self._run_batch, max_batch_size, wait_s)

    async def complete(self, jobs: list[Job]) -> list[Result]:
        return list(await asyncio.gather(*(self._batcher.submit(j) for j in jobs)))

    async def _run_batch(self, jobs: list[Job]) -> list[Result]:
        def work():
            with self._lock:
                done = self.generator.generate([j.prompt for j in jobs], [j.params for j in jobs])
            return [
                Result(c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens) for c in done
            ]

        return await asyncio.to_thread(work)
