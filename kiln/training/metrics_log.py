"""Per-step metrics kept where the run is: one JSON line and TensorBoard scalars per step, read
back (a restart's re-run steps replacing the first attempt's) and plotted as a loss curve; the
time left for the progress line.

Nothing here talks to Ray: on Ray Train rank 0 writes these locally every step, and only
checkpoints and the final metrics are reported to Ray Train (`kiln.training.ray_report`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    """Appends each step's metrics to `<run_dir>/metrics.jsonl` and `<run_dir>/tensorboard/`."""

    def __init__(self, run_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(run_dir, exist_ok=True)
        self.jsonl = open(os.path.join(run_dir, METRICS_FILE), "a")  # noqa: SIM115 - open for the run
        self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))  # writes on its own thread

    def write(self, metrics: dict[str, Any]) -> None:
        step = int(metrics["step"])
        self.jsonl.write(json.dumps({**metrics, "time": time.time()}, default=float) + "\n")
        self.jsonl.flush()  # a killed worker loses at most the step it was on
        for k, v in metrics.items():
            if k != "step" and isinstance(v, int | float):
                tag = f"val/{k[4:]}" if k.startswith("val_") else f"train/{k}"
                self.tb.add_scalar(tag, v, step)

    def close(self) -> None:
        self.jsonl.close()
        self.tb.close()


class ProgressClock:
    """Time left to `total_steps` at the pace since the first step this process finished (so
    neither the first step's warm-up nor a resumed run's earlier steps count)."""

    def __init__(self, total_steps: int) -> None:
        self.total = total_steps
        self._start: tuple[int, float] | None = None

    def eta(self, step: int) -> str:
        """Call after every step; "h:mm:ss", or "?" until a second step gives a pace."""
        now = time.monotonic()
        if self._start is None:
            self._start = (step, now)
        first, t0 = self._start
        if step <= first:
            return "?"
        s = int((now - t0) / (step - first) * max(self.total - step, 0))
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def progress_line(m: dict[str, Any], total_steps: int, eta: str) -> str:
    """The one console line of a logged step."""
    mfu = f"{100 * m['mfu']:.1f}%" if m["mfu"] is not None else "n/a"
    val = f"val_loss {m['val_loss']:.4f} " if "val_loss" in m else ""
    return (
        f"step {m['step']}/{total_steps} loss {m['loss']:.4f} {val}grad_norm {m['grad_norm']:.3f} "
        f"lr {m['lr']:.2e} tokens/s {m['tokens_per_s']:.0f} mfu {mfu} "
        f"peak_mem {m['peak_mem_gb']:.2f}GB ETA {eta}"
    )


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """Per-step metrics; after a restart the re-run steps replace the first attempt's."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    by_step: dict[int, dict] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def plot_loss_curve(history: list[dict[str, Any]], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in history], [h.get("loss") for h in history], lw=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
