"""Restoring a run from a checkpoint: the `load` half of `Checkpointer` (checkpointer.py).

A mixin: it reads the attributes `Checkpointer.__init__` sets (cfg, root, model_parts,
optimizers, lr_schedulers, dataloader, train_state, rank, world_size, dp_rank, dp_size, the save
process group) and its `_model_state` / `_apply_model_state`, which post-training narrows.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed.checkpoint as dcp

from kiln.model.formats import storage
from kiln.model.formats.dcp_io import WRITE_ERRORS, make_reader
from kiln.model.formats.safe_reader import SafeLoadPlanner
from kiln.platform.errors import InputError
from kiln.training.checkpoint import json_state
from kiln.training.checkpoint import state as S

log = logging.getLogger("kiln.checkpoint")


class Restore:
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
        state: dict[str, Any] = {"model": model_sd}
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
        self._apply_model_state(state["model"], model_keys)
        if full:
            self._apply_training_state(state, optim_keys, sidecar)
        self._last_saved_step = int(sidecar.get("step", -1))
        self.committed = (self._last_saved_step, path)
        log.info(
            "loaded checkpoint %s (step %s) in %.2fs",
            path,
            sidecar.get("step"),
            time.perf_counter() - t0,
        )
        return True

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
