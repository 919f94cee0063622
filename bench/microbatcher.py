"""Dynamic batching of concurrent calls, in plain asyncio: what `@serve.batch` does, without
needing a Ray Serve replica (so the app also runs in-process: tests, benchmarks, embedding).

    batcher = MicroBatcher(run_batch, max_batch_size=8, wait_s=0.01)
    result = await batcher.submit(item)       # run_batch(list_of_items) -> list_of_results

A batch starts with the first waiting item and takes whatever else arrives within `wait_s`, up
to `max_batch_size`; one batch runs at a time. A result that is an Exception is raised to its
own caller only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class MicroBatcher:
    IDLE_S = 1.0

    def __init__(
        self,
        run_batch: Callable[[list[Any]], Awaitable[list[Any]]],
        max_batch_size: int = 8,
        wait_s: float = 0.01,
    ) -> None:
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            self._loop, self._queue = loop, asyncio.Queue()
            self._task = loop.create_task(self._serve())
        future = loop.create_future()
        self._queue.put_nowait((item, future))  # type: ignore[union-attr]
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    async def _serve(self) -> None:
        queue = self._queue
        assert queue is not None
        loop = asyncio.get_running_loop()
        while True:
            try:  # idle: end, so no task outlives its event loop; submit() starts a new one
                batch = [await asyncio.wait_for(queue.get(), self.IDLE_S)]
            except TimeoutError:
                if queue.empty():
                    return
                continue
            deadline = loop.time() + self.wait_s
            while len(batch) < self.max_batch_size:
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), left))
                except TimeoutError:
                    break
            live = [(item, f) for item, f in batch if not f.done()]
            if live:
                await self._run(live)

    async def _run(self, live: list) -> None:
        try:
            results = await self.run_batch([item for item, _ in live])
        except Exception as e:  # noqa: BLE001 - delivered to every caller of this batch
            results = [e] * len(live)
        for (_, future), result in zip(live, results, strict=True):
            if not future.done():
                future.set_result(result)
