"""The training data loader: data-parallel split, deterministic, resumable, prefetching.

Batch b of DP rank r holds global samples `start + b * B * dp_size + r * B + [0, B)`, where
`start` is where the loader (re)started. The whole state is the number of global samples consumed,
so a resumed loader sees exactly the batches an uninterrupted one would — also with a different
DP size or micro-batch size after the restart. Ranks of one replica (TP, CP, PP) pass the same
`dp_rank` and get the same batch. Batches are assembled in a background thread; the state counts
only batches handed out, never those prefetched.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import weakref
from typing import Any, Protocol

import numpy as np

from kiln.training.data.config import DataConfig
from kiln.training.data.sources import IndexedSource, SyntheticSource


@functools.cache
def _torch():
    import torch  # imported on first use: the CLI imports this package and should stay fast

    return torch


class SampleSource(Protocol):
    def gather(self, ids: np.ndarray) -> np.ndarray: ...

    def gather_range(self, first: int, count: int) -> np.ndarray: ...


class TokenLoader:
    """Iterable of `(tokens [B, S], labels [B, S])` int64 tensors; endless.

    A source with `gather_batch(first, count)` (chat data) yields its own tuple instead:
    `(tokens, labels, positions, document_ids)`, labels -100 where not trained on."""

    def __init__(
        self,
        source: SampleSource,
        *,
        seq_len: int,
        micro_batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        prefetch: int = 2,
        description: dict[str, Any] | None = None,
        pin_memory: bool = False,
    ) -> None:
        """`pin_memory`: batches come in page-locked host memory (pinned in the prefetch thread),
        so the copy to a CUDA device can be non-blocking; the trainer sets it on CUDA."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        self.source = source
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.prefetch = prefetch
        self.description = description or {}
        self.pin_memory = pin_memory
        self._start = 0  # global samples consumed before this loader's first batch
        self._delivered = 0  # batches handed out since `_start`
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()

    # -- addressing ----------------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.dp_size

    @property
    def samples_consumed(self) -> int:
        return self._start + self._delivered * self.global_batch_size

    def first_sample(self, batch: int) -> int:
        """Global number of the first sample of this rank's `batch`-th batch since the (re)start."""
        return self._start + batch * self.global_batch_size + self.dp_rank * self.micro_batch_size

    def sample_ids(self, batch: int) -> np.ndarray:
        """Global sample numbers of this rank's `batch`-th batch since the (re)start."""
        first = self.first_sample(batch)
        return np.arange(first, first + self.micro_batch_size, dtype=np.int64)

    def _assemble(self, batch: int):
        torch = _torch()
        if hasattr(self.source, "gather_batch"):  # chat data: (tokens, labels, positions, doc ids)
            arrays = self.source.gather_batch(self.first_sample(batch), self.micro_batch_size)
            out = tuple(torch.from_numpy(a) for a in arrays)
        else:
            samples = self.source.gather_range(self.first_sample(batch), self.micro_batch_size)
            out = torch.from_numpy(samples[:, :-1]), torch.from_numpy(samples[:, 1:])
        return tuple(t.pin_memory() for t in out) if self.pin_memory else out

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> TokenLoader:
        return self

    def __next__(self):
        if self.prefetch <= 0:
            out = self._assemble(self._delivered)
        else:
            if self._thread is None:
                self._start_prefetch()
            out = self._queue.get()
            if isinstance(out, BaseException):
                self.close()
                raise out
        self._delivered += 1
        return out

    def _start_prefetch(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        # The thread holds only a weak reference, so a loader dropped mid-iteration is collected
        # and its thread ends instead of idling forever.
        self._thread = threading.Thread(
            target=_produce,
            args=(weakref.ref(self), self._delivered, self._stop, self._queue),
            daemon=True,
            name="kiln-prefetch",
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the prefetch thread (the loader can be iterated again afterwards)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
        self._thread = None
        self._queue = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn down threading
            self.close()

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "samples_consumed": self.samples_consumed,
            "seq_len": self.seq_len,
            "micro_batch_size": self.micro_batch_size,
            "dp_size": self.dp_size,
            **self.description,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after `state["samples_consumed"]` global samples (any DP/micro-batch size)."""
        if state.get("seq_len", self.seq_len) != self.seq_len:
            raise ValueError(
                f"loader state is for seq_len {state['seq_len']}, this loader has {self.seq_len}"
            )
        self.close()
        self._start = int(state["samples_consumed"])
        self._delivered = 0


def _produce(loader_ref: weakref.ref, batch: int, stop: threading.Event, q: queue.Queue) -> None:
    """Prefetch thread: assemble batch after batch until stopped or the loader is gone."""
    while not stop.is_set():
        loader = loader_ref()
        if loader is None:
            return
        try:
            item = loader._assemble(batch)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer's thread
            item = e
        del loader
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                break
            except queue.Full:
                if loader_ref() is None:
                    return
        if isinstance(item, BaseException):
            return
        batch += 1


def build_dataloader(
    cfg: DataConfig,
    *,
    seq_len: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    seed: int,
    vocab_size: int | None = None,
) -> TokenLoader:
    """An endless, resumable loader of `(tokens, labels)` [micro_batch_size, seq_len] int64 batches.

    Only data-parallel ranks split the data: TP/CP/PP ranks of one replica pass the same `dp_rank`.
    `cfg.seed` (if set) overrides `seed` for shuffling.
    """
    data_seed = seed if cfg.seed is None else cfg.seed
    if cfg.synthetic:
        source = SyntheticSource(vocab_size, seq_len, data_seed)
        description = {"source": "synthetic", "seed": data_seed}
    else:
        source = IndexedSource(cfg, seq_len, data_seed, vocab_size)
        description = {
            "source": "indexed",
            "seed": data_seed,
            "paths": list(cfg.paths),
            "split": cfg.split,
        }
    return TokenLoader(
        source,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        prefetch=cfg.prefetch,
        description=description,
    )
