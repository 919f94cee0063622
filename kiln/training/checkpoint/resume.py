"""The console line a resumed training stage prints, whichever way it trains (in this process or
on Ray Train workers): the step of the checkpoint it continues from."""

from __future__ import annotations

import logging

from kiln.model.formats.checkpoint import latest_checkpoint, read_sidecar

log = logging.getLogger("kiln.train")


def announce_resume(ckpt_root: str | None) -> int | None:
    """The step of the checkpoint under `ckpt_root` an earlier, stopped run left (the trainer
    resumes from it), said on the console; None for a fresh start."""
    latest = latest_checkpoint(ckpt_root) if ckpt_root else None
    if latest is None:
        return None
    try:
        step = int(read_sidecar(latest)["step"])
    except Exception:  # noqa: BLE001 - unreadable: the trainer decides (and warns) itself
        return None
    log.info("resuming from checkpoint step %d", step)
    log.debug("resuming from %s", latest)
    return step
