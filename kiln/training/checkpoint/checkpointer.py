"""Parallel (optionally async) checkpoints with torch.distributed.checkpoint.

Every rank writes its own shard; rank 0 then writes the `kiln.json` sidecar and moves the
`latest` pointer. DCP's save ends in an all-reduce after the coordinator wrote `.metadata`, so
once it returns every rank's shard is on storage: a crash at any earlier point leaves `latest`
naming the previous complete checkpoint.

A save that fails (a full disk, a lost mount) removes its half-written folder and leaves `latest`
alone: a synchronous one stops training with a one-line `CheckpointWriteError`; a background one
is logged as a warning and training goes on (the next save tries again), except the final save.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from kiln.model.formats import storage
from kiln.model.formats.dcp_io import WRITE_ERRORS, make_reader, make_writer
from kiln.model.formats.safe_reader import SafeLoadPlanner
from kiln.platform.errors import InputError, KilnError
from kiln.training.checkpoint import json_state
from kiln.training.checkpoint import state as S
from kiln.training.checkpoint.config import CheckpointConfig


def _one_process_saves_are_meant() -> None:
    """A one-process run saves with no process group on purpose; DCP warns about that at every
    save (even given no_dist=True), and the warning would land in every such run's log.
    (Installed by each one-process Checkpointer: a filter added inside a `catch_warnings` block,
    as pytest runs each test, ends with it.)"""
    warnings.filterwarnings(  # replaces an identical filter: never a growing list
        "ignore",
        message="torch.distributed is disabled, unavailable or uninitialized",
        category=UserWarning,
        module=r"torch\.distributed\.checkpoint",
    )


class CheckpointWriteError(KilnError):
    """A checkpoint could not be written (disk full, storage gone); `latest` is unchanged."""


if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from kiln.training.parallel.dims import ParallelDims
    from kiln.training.train_state import TrainState

log = logging.getLogger("kiln.checkpoint")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Checkpointer:
    """Saves and restores a run's stateful components (torchtitan's CheckpointManager).

    It is given the model parts, their optimizers, the lr schedulers, the data loader and the
    `TrainState`; `dims` gives the data-parallel coordinates (whose loader position is whose)
    and the world size (RNG states are restored only into the same layout). `model_config` and
    `train_config` (JSON-ready dicts) go into the `kiln.json` sidecar for export and inspection.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        model_parts: Sequence[nn.Module],
        optimizers: Sequence[Optimizer],
        train_state: TrainState,
        lr_schedulers: Sequence[Stateful] = (),
        dataloader: Stateful | None = None,
        dims: ParallelDims | None = None,
        total_steps: int | None = None,
        model_config: dict[str, Any] | None = None,
        train_config: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.model_parts, self.optimizers = list(model_parts), list(optimizers)
        self.lr_schedulers, self.dataloader = list(lr_schedulers), dataloader
        self.train_state, self.total_steps = train_state, total_steps
        self.model_config, self.train_config = model_config or {}, train_config
        self.root = cfg.dir.rstrip("/") if cfg.dir else None
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dims.world_size if dims is not None else 1
        self.dp_rank = dims.dp_rank if dims is not None else 0
        self.dp_size = dims.dp_size if dims is not None else 1
        # DCP's plan/commit collectives run on their own gloo groups: an async save's background
        # thread must not interleave with training collectives (or with our control messages).
        self._save_pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._control_pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        if not dist.is_initialized():
            _one_process_saves_are_meant()
        self._inflight: tuple[Future, int, str, dict] | None = None
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self.committed: tuple[int, str] | None = None  # (step, dir) of the newest complete one
        self._staging = None

    # -- restoring --------------------------------------------------------------------------

    def load(self) -> bool:
        """Restore from `load_from`, the latest complete checkpoint in `dir`, or (a fresh run)
        the weights of `init_from`. False if there is none."""
        source = self._source()
        if source is None:
            return False
        path, weights_only = source
        if not storage.is_complete(path):
            raise InputError(
                f"checkpoint.load_from: {path} is not a complete checkpoint "
                "(no .metadata or kiln.json)"
            )
        t0 = time.perf_counter()
        sidecar = storage.read_json(storage.join(path, storage.SIDECAR))
        reader = make_reader(path)
        try:
            available = set(reader.read_metadata().state_dict_metadata)
        except WRITE_ERRORS as exc:
            raise InputError(f"{path}: {storage.read_failure(exc)}") from exc
        model_sd, model_keys = self._model_state()
        fresh = self._fresh_mtp_modules(path, model_sd, available, weights_only)
        state: dict[str, Any] = {"model": {k: v for k, v in model_sd.items() if k not in fresh}}
        has_optimizer = any(k.startswith("optimizer.") for k in available)
        # a run's last save without optimizer state still resumes: step, data position, schedule
        model_only = bool(sidecar.get("model_only")) and not weights_only
        full = self.cfg.load_optimizer and (has_optimizer or model_only) and not weights_only
        if self.cfg.load_optimizer and not (has_optimizer or model_only):
            log.info("%s holds weights only (e.g. imported): starting a fresh run from them", path)
        elif full and not has_optimizer:
            log.info("%s holds no optimizer state (last_save_model_only): a fresh one", path)
        optim_keys = (
            self._request_training_state(state, available, sidecar, has_optimizer) if full else None
        )
        try:
            dcp.load(
                state,
                storage_reader=reader,
                planner=SafeLoadPlanner(),
                process_group=self._save_pg,
            )
        except WRITE_ERRORS as exc:  # a truncated or corrupt shard file: one line, no traceback
            raise InputError(f"{path}: {storage.read_failure(exc)}") from exc
        self._apply_model_state({**model_sd, **state["model"]}, model_keys)
        if full:
            self._apply_training_state(state, optim_keys, sidecar)
        if not weights_only:  # a resume: that save is this run's; a new run has saved nothing
            self._last_saved_step = int(sidecar.get("step", -1))
            self.committed = (self._last_saved_step, path)
        log.info(
            "loaded checkpoint %s (step %s) in %.2fs",
            path,
            sidecar.get("step"),
            time.perf_counter() - t0,
        )
        return True

    @staticmethod
    def _fresh_mtp_modules(
        path: str, model_sd: dict[str, Any], available: set[str], weights_only: bool
    ) -> set[str]:
        """Multi-token prediction weights the checkpoint lacks (an import, or a run without
        `mtp_depth`): a new run from it (`init_from`) keeps their fresh init; a resume refuses."""
        missing = {k for k in model_sd if k.startswith("mtp.") and f"model.{k}" not in available}
        if missing and not weights_only:
            raise InputError(
                f"{path} holds no multi-token prediction modules ({min(missing)}): resume it "
                "with model.mtp_depth: 0, or start a new run from it with checkpoint.init_from"
            )
        if missing:
            log.info("%s: no MTP modules in it, they start from their init", path)
        return missing

    def _source(self) -> tuple[str, bool] | None:
        """(checkpoint folder, weights only?): load_from, else dir's latest, else init_from."""
        if self.cfg.load_from:
            return self.cfg.load_from.rstrip("/"), False
        latest = storage.latest_checkpoint(self.root) if self.root else None
        if latest is not None:
            return latest, False
        if self.cfg.init_from:  # a new run: weights from elsewhere, fresh optimizer and data
            root = self.cfg.init_from.rstrip("/")
            return storage.latest_checkpoint(root) or root, True
        return None

    def _request_training_state(
        self,
        state: dict[str, Any],
        available: set[str],
        sidecar: dict[str, Any],
        optimizer: bool,
    ) -> list[list[str]] | None:
        """Add placeholders for the optimizer (if saved), schedule, train state, data position
        and RNG that DCP fills in; returns each part's optimizer keys (None: no optimizer)."""
        optim_keys = None
        if optimizer:
            state["optimizer"], optim_keys = S.optimizer_state(self.model_parts, self.optimizers)
        state["train"] = self.train_state.state_dict()
        if self.lr_schedulers and any(k.startswith("lr_scheduler.") for k in available):
            state["lr_scheduler"] = self.lr_schedulers[0].state_dict()
        layout = sidecar.get("layout", {})
        # A changed dp size has no rank-to-rank mapping; loaders keep a global position, so
        # dp0's serves all.
        src = self.dp_rank if layout.get("dp_size") == self.dp_size else 0
        if f"dataloader.dp{src}" in available and self.dataloader is not None:
            state["dataloader"] = {f"dp{src}": b""}
        if layout.get("world_size") == self.world_size and f"rng.rank{self.rank}" in available:
            state["rng"] = {f"rank{self.rank}": b""}
        return optim_keys

    def _apply_training_state(
        self, state: dict[str, Any], optim_keys: list[list[str]] | None, sidecar: dict[str, Any]
    ) -> None:
        if optim_keys is not None:
            S.apply_optimizer_state(
                self.model_parts, self.optimizers, state["optimizer"], optim_keys
            )
        if "lr_scheduler" in state:
            for scheduler in self.lr_schedulers:
                scheduler.load_state_dict(dict(state["lr_scheduler"]))
        self.train_state.load_state_dict(state["train"])
        if "dataloader" in state:
            blob = next(iter(state["dataloader"].values()))
            loader_state = json_state.decode_loader(blob, sidecar)
            if loader_state is not None:
                self.dataloader.load_state_dict(loader_state)
        if "rng" in state:
            json_state.restore_rng(state["rng"][f"rank{self.rank}"])

    # -- saving -----------------------------------------------------------------------------

    def save(self, step: int, force: bool = False) -> bool:
        """Save if the interval (steps or minutes) or the last step says so; True if it did."""
        self.poll()
        if self.root is None or not self._due(step, force):
            return False
        t_wait = time.perf_counter()
        self.wait(raise_errors=False)  # at most one save in flight
        path = storage.join(self.root, storage.step_dir_name(step))
        self._prepare(path)
        state = self._state_for_save(step)
        log.debug(
            "checkpoint step %d: waited/prepared/collected in %.2fs",
            step,
            time.perf_counter() - t_wait,
        )
        sidecar = self._sidecar(step) if self.rank == 0 else {}
        self._write(state, step, path, sidecar)
        self._last_saved_step = step
        self._last_save_time = time.monotonic()
        return True

    def _write(self, state: dict[str, Any], step: int, path: str, sidecar: dict) -> None:
        """Sync: write and commit. Async: stage to CPU now, write and commit in the background."""
        writer = make_writer(path, self.cfg.thread_count)
        t0 = time.perf_counter()
        if not self.cfg.async_save:
            try:
                dcp.save(state, storage_writer=writer, process_group=self._save_pg)
                log.info("checkpoint step %d: written in %.2fs", step, time.perf_counter() - t0)
                self._commit(step, path, sidecar)
            except WRITE_ERRORS as exc:
                raise self._failed(step, path, exc) from exc
            return
        response = dcp.async_save(
            state, storage_writer=writer, process_group=self._save_pg, async_stager=self._stager()
        )
        future = getattr(response, "upload_completion", response)
        self._inflight = (future, step, path, sidecar)
        log.info(
            "checkpoint step %d: staged in %.2fs, writing in the background",
            step,
            time.perf_counter() - t0,
        )

    def poll(self) -> None:
        """Commit a finished background save (non-blocking)."""
        if self._inflight is not None and self._inflight[0].done():
            self.wait(raise_errors=False)

    def wait(self, raise_errors: bool = True) -> None:
        """Block until the background save (if any) finished, then commit it. A failed one is
        raised, or only logged when training can go on (`raise_errors=False`)."""
        if self._inflight is None:
            return
        future, step, path, sidecar = self._inflight
        self._inflight = None
        try:
            future.result()
            self._commit(step, path, sidecar)
        except WRITE_ERRORS as exc:
            error = self._failed(step, path, exc)
            if raise_errors:
                raise error from exc
            log.warning("%s; training goes on", error)

    def _failed(self, step: int, path: str, exc: Exception) -> CheckpointWriteError:
        """Remove the half-written folder (rank 0) and say in one line what failed."""
        cause = storage.write_failure(path, exc)  # before the removal frees the disk again
        if self.rank == 0:
            try:
                storage.remove(path)
            except OSError as cleanup:
                log.warning("could not remove the unfinished %s: %s", path, cleanup)
        latest = storage.latest_checkpoint(self.root)
        return CheckpointWriteError(
            f"checkpoint step {step}: writing {path} failed ({cause}); "
            f"latest is still {latest or 'none'}"
        )

    def close(self) -> None:
        self.wait()  # the final save must not fail quietly
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    def _stager(self):
        """One stager for the whole run: it keeps its CPU copy of the state between saves, so
        staging after the first save is a memcpy into memory already touched, not a fresh
        allocation whose pages the kernel must zero first."""
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
        if self.cfg.save_final and self.total_steps is not None and step >= self.total_steps:
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

    def _model_state(self) -> tuple[dict[str, Any], list[list[str]]]:
        """The model entries saved and loaded (post-training's adapter checkpoints narrow it)."""
        return S.model_state(self.model_parts)

    def _apply_model_state(self, state: dict[str, Any], keys: list[list[str]]) -> None:
        S.apply_model_state(self.model_parts, state, keys)

    def _state_for_save(self, step: int) -> dict[str, Any]:
        state: dict[str, Any] = {
            "model": self._model_state()[0],
            "train": {**self.train_state.state_dict(), "step": int(step)},
            "rng": {f"rank{self.rank}": json_state.encode_rng()},
        }
        if self.optimizers and not self._model_only(step):  # none: weights-only (import-hf)
            state["optimizer"] = S.optimizer_state(self.model_parts, self.optimizers)[0]
        if self.lr_schedulers:
            state["lr_scheduler"] = self.lr_schedulers[0].state_dict()
        if self.dataloader is not None:
            state["dataloader"] = {
                f"dp{self.dp_rank}": json_state.encode_loader(self.dataloader.state_dict())
            }
        return state

    def _model_only(self, step: int) -> bool:
        """The last save of a run with `last_save_model_only`: no optimizer state."""
        last = self.total_steps is not None and step >= self.total_steps
        return self.cfg.last_save_model_only and last

    def _sidecar(self, step: int) -> dict[str, Any]:
        return {
            "format": "kiln-dcp-v1",
            "step": int(step),
            "model_only": self._model_only(step),
            "tokens_seen": int(self.train_state.tokens_seen),
            "model": self.model_config,
            "layout": {
                "world_size": self.world_size,
                "dp_size": self.dp_size,
                "parallel": (self.train_config or {}).get("parallel"),
            },
            "dataloader": self.dataloader.state_dict() if self.dataloader is not None else None,
            "train_config": self.train_config,
            "saved_at": time.time(),
        }
