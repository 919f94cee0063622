"""Parallel (optionally async) checkpoints with torch.distributed.checkpoint.

Every rank writes its own shard; rank 0 then writes the `kiln.json` sidecar and moves the
`latest` pointer. DCP's save ends in an all-reduce after the coordinator wrote `.metadata`, so
once it returns every rank's shard is on storage: a crash at any earlier point leaves `latest`
naming the previous complete checkpoint.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from kiln.platform.errors import InputError
from kiln.training.checkpoint import state as S
from kiln.training.checkpoint import storage
from kiln.training.checkpoint.config import CheckpointConfig

log = logging.getLogger("kiln.checkpoint")


def make_writer(uri: str, thread_count: int = 1):
    if storage.is_local(uri):
        return FileSystemWriter(
            uri.removeprefix("file://"), thread_count=thread_count, sync_files=True
        )
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(uri, thread_count=thread_count, sync_files=True)


def make_reader(uri: str):
    if storage.is_local(uri):
        return FileSystemReader(uri.removeprefix("file://"))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(uri)


def _model_config(trainer) -> dict[str, Any]:
    cfg = getattr(trainer, "model_config", None) or getattr(
        getattr(trainer, "cfg", None), "model", None
    )
    if isinstance(cfg, str):
        from kiln.training.model.config import ModelConfig

        cfg = ModelConfig.preset(cfg)
    if hasattr(cfg, "model_dump"):
        return cfg.model_dump(mode="json")
    return dict(cfg) if isinstance(cfg, dict) else {}


def _dump(obj) -> dict[str, Any] | None:
    return obj.model_dump(mode="json", by_alias=True) if hasattr(obj, "model_dump") else None


class Checkpointer:
    """Saves and restores a trainer: model parts, optimizers, schedulers, data position, RNG."""

    def __init__(self, cfg: CheckpointConfig, trainer) -> None:
        self.cfg = cfg
        self.trainer = trainer
        self.root = cfg.dir.rstrip("/") if cfg.dir else None
        self.rank = S.world_rank()
        self.world_size = S.world_size()
        # DCP's plan/commit collectives run on their own gloo groups: an async save's background
        # thread must not interleave with training collectives (or with our control messages).
        self._save_pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._control_pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._inflight: tuple[Future, int, str, dict] | None = None
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self.committed: tuple[int, str] | None = None  # (step, dir) of the newest complete one
        self.on_commit: list[Callable[[int, str], None]] = []  # rank 0: called after `latest` moved
        self.loaded_from: str | None = None
        self._staging = None

    # -- saving -----------------------------------------------------------------------------

    def save(self, step: int, force: bool = False) -> bool:
        """Save if the interval (steps or minutes) or the last step says so. Returns whether it did."""
        self.poll()
        if self.root is None or not self._due(step, force):
            return False
        t_wait = time.perf_counter()
        self.wait()  # at most one save in flight
        path = storage.join(self.root, storage.step_dir_name(step))
        self._prepare(path)
        state = self._state_for_save(step)
        log.debug(
            "checkpoint step %d: waited/prepared/collected in %.2fs",
            step,
            time.perf_counter() - t_wait,
        )
        sidecar = self._sidecar(step) if self.rank == 0 else {}
        writer = make_writer(path, self.cfg.thread_count)
        t0 = time.perf_counter()
        if self.cfg.async_save:
            response = dcp.async_save(
                state,
                storage_writer=writer,
                process_group=self._save_pg,
                async_stager=self._stager(),
            )
            future = getattr(response, "upload_completion", response)
            self._inflight = (future, step, path, sidecar)
            log.info(
                "checkpoint step %d: staged in %.2fs, writing in the background",
                step,
                time.perf_counter() - t0,
            )
        else:
            dcp.save(state, storage_writer=writer, process_group=self._save_pg)
            log.info("checkpoint step %d: written in %.2fs", step, time.perf_counter() - t0)
            self._commit(step, path, sidecar)
        self._last_saved_step = step
        self._last_save_time = time.monotonic()
        return True

    def poll(self) -> None:
        """Commit a finished background save (non-blocking)."""
        if self._inflight is not None and self._inflight[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until the background save (if any) finished, then commit it."""
        if self._inflight is None:
            return
        future, step, path, sidecar = self._inflight
        self._inflight = None
        future.result()
        self._commit(step, path, sidecar)

    def close(self) -> None:
        self.wait()
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    def _stager(self):
        """One stager for the whole run: it keeps its CPU copy of the state between saves, so
        staging after the first save is a memcpy into memory already touched (~5x faster on CPU)."""
        if self._staging is None:
            import torch
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._staging = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,  # training may change the params right after save()
                    use_non_blocking_copy=False,
                )
            )
        return self._staging

    def _due(self, step: int, force: bool) -> bool:
        if force:
            return True
        if step == self._last_saved_step:
            return False
        total = getattr(getattr(self.trainer, "cfg", None), "steps", None)
        if self.cfg.save_final and total is not None and step >= total:
            return True
        if self.cfg.interval_steps and step % self.cfg.interval_steps == 0:
            return True
        if self.cfg.interval_minutes:
            due = [time.monotonic() - self._last_save_time >= self.cfg.interval_minutes * 60]
            if self._control_pg is not None:  # rank 0's clock decides for everyone
                dist.broadcast_object_list(due, src=0, group=self._control_pg)
            return bool(due[0])
        return False

    def _prepare(self, path: str) -> None:
        """Clear a half-written folder a crash left at this step, then let every rank write."""
        if self.rank == 0:
            latest = storage.latest_checkpoint(self.root)
            if latest is None or latest.rstrip("/") != path:
                storage.remove(path)
            fs, p = storage.fs_and_path(path)
            fs.makedirs(p, exist_ok=True)
        if self._control_pg is not None:
            dist.barrier(group=self._control_pg)

    def _commit(self, step: int, path: str, sidecar: dict) -> None:
        self.committed = (step, path)
        if self.rank != 0:
            return
        storage.write_json(storage.join(path, storage.SIDECAR), sidecar)
        storage.set_latest(self.root, path)
        removed = storage.prune(self.root, self.cfg.keep_last)
        log.info(
            "checkpoint step %d committed: %s%s",
            step,
            path,
            f" (pruned {len(removed)})" if removed else "",
        )
        for callback in self.on_commit:
            callback(step, path)

    def _state_for_save(self, step: int) -> dict[str, Any]:
        t = self.trainer
        state: dict[str, Any] = {
            "model": S.model_state(t.model_parts)[0],
            "optimizer": S.optimizer_state(t.model_parts, t.optimizers)[0],
            "train": {"step": int(step), "tokens_seen": int(getattr(t, "tokens_seen", 0))},
            "rng": {f"rank{self.rank}": S.rng_state()},
        }
        schedulers = list(getattr(t, "lr_schedulers", None) or [])
        if schedulers:
            state["lr_scheduler"] = schedulers[0].state_dict()
        blob = S.dataloader_state(t)
        if blob is not None:
            state["dataloader"] = {f"dp{S.data_parallel_coords(t)[0]}": blob}
        return state

    def _sidecar(self, step: int) -> dict[str, Any]:
        t = self.trainer
        cfg = getattr(t, "cfg", None)
        loader = getattr(t, "dataloader", None)
        dp_size = S.data_parallel_coords(t)[1]
        return {
            "format": "kiln-dcp-v1",
            "step": int(step),
            "tokens_seen": int(getattr(t, "tokens_seen", 0)),
            "model": _model_config(t),
            "layout": {
                "world_size": self.world_size,
                "dp_size": dp_size,
                "parallel": _dump(getattr(cfg, "parallel", None)),
            },
            "dataloader": loader.state_dict()
            if loader is not None and hasattr(loader, "state_dict")
            else None,
            "train_config": _dump(cfg),
            "saved_at": time.time(),
        }

    # -- loading ----------------------------------------------------------------------------

    def checkpoint_to_load(self) -> str | None:
        self._weights_only = False
        if self.cfg.load_from:
            return self.cfg.load_from.rstrip("/")
        latest = storage.latest_checkpoint(self.root) if self.root else None
        if latest is None and self.cfg.init_from:
            self._weights_only = True  # new run: weights from elsewhere, fresh optimizer and data
            root = self.cfg.init_from.rstrip("/")
            return storage.latest_checkpoint(root) or root
        return latest

    def load(self) -> bool:
        """Restore from `load_from` or the latest complete checkpoint in `dir`; False if none."""
        path = self.checkpoint_to_load()
        if path is None:
            return False
        if not storage.is_complete(path):
            raise InputError(
                f"checkpoint.load_from: {path} is not a complete checkpoint (no .metadata or kiln.json)"
            )
        t0 = time.perf_counter()
        sidecar = storage.read_json(storage.join(path, storage.SIDECAR))
        reader = make_reader(path)
        available = set(reader.read_metadata().state_dict_metadata)
        t = self.trainer
        model_sd, model_keys = S.model_state(t.model_parts)
        state: dict[str, Any] = {"model": model_sd}
        has_training_state = any(k.startswith("optimizer.") for k in available)
        full = self.cfg.load_optimizer and has_training_state and not self._weights_only
        if self.cfg.load_optimizer and not has_training_state:
            log.info("%s holds weights only (e.g. imported): starting a fresh run from them", path)
        if full:
            optim_sd, optim_keys = S.optimizer_state(t.model_parts, t.optimizers)
            state["optimizer"] = optim_sd
            state["train"] = {"step": 0, "tokens_seen": 0}
            schedulers = list(getattr(t, "lr_schedulers", None) or [])
            if schedulers and any(k.startswith("lr_scheduler.") for k in available):
                state["lr_scheduler"] = schedulers[0].state_dict()
            same_layout = sidecar.get("layout", {}).get("world_size") == self.world_size
            dp_rank, dp_size = S.data_parallel_coords(t)
            # A changed dp size has no rank-to-rank mapping; loaders keep a global position, so dp0's serves all.
            src = dp_rank if sidecar.get("layout", {}).get("dp_size") == dp_size else 0
            if f"dataloader.dp{src}" in available and getattr(t, "dataloader", None) is not None:
                state["dataloader"] = {f"dp{src}": b""}
            if same_layout and f"rng.rank{self.rank}" in available:
                state["rng"] = {f"rank{self.rank}": b""}
        dcp.load(state, storage_reader=reader, process_group=self._save_pg)
        S.apply_model_state(t.model_parts, state["model"], model_keys)
        if full:
            S.apply_optimizer_state(t.model_parts, t.optimizers, state["optimizer"], optim_keys)
            for scheduler in getattr(t, "lr_schedulers", None) or []:
                if "lr_scheduler" in state:
                    scheduler.load_state_dict(dict(state["lr_scheduler"]))
            t.step = int(state["train"]["step"])
            t.tokens_seen = int(state["train"]["tokens_seen"])
            if "dataloader" in state:
                t.dataloader.load_state_dict(pickle.loads(next(iter(state["dataloader"].values()))))
            if "rng" in state:
                S.set_rng_state(state["rng"][f"rank{self.rank}"])
        self._last_saved_step = int(sidecar.get("step", -1))
        self.committed = (self._last_saved_step, path)
        self.loaded_from = path
        log.info(
            "loaded checkpoint %s (step %s) in %.2fs",
            path,
            sidecar.get("step"),
            time.perf_counter() - t0,
        )
        return True
