"""Ray Train's `TorchTrainer` without the helper actors a kiln run never uses.

Beside its workers, each Ray Train worker group brings a controller and helper actors, each one
a process that imports ray.train (~4 CPU s on a laptop core). kiln never hands Ray Train a
dataset (its loader reads the token files itself), so the DatasetManager actor is left out. On an
embedded Ray, which runs on one machine and ends with its driver, so are the PlacementGroupCleaner
(it removes a run's placement group when the controller dies and the cluster lives on) and the
preemption watcher (it polls for nodes being drained; a value of its variable the user set is
kept). The helpers are found by class name: a Ray that renames them keeps them, which costs time,
never correctness.
"""

from __future__ import annotations

import contextlib
import os

from ray.train.torch import TorchTrainer

# read by the controller, which Ray Train hands the driver's environment at `fit`
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


class LeanTorchTrainer(TorchTrainer):
    def __init__(self, *args, embedded: bool = False, **kwargs) -> None:
        self._embedded = embedded
        super().__init__(*args, **kwargs)

    def _create_default_callbacks(self):
        unused = set() if self.datasets else {"DatasetsCallback"}
        if self._embedded:
            unused.add("PlacementGroupCleanerCallback")
        callbacks = super()._create_default_callbacks()
        return [cb for cb in callbacks if type(cb).__name__ not in unused]

    def fit(self):
        self._controller = None
        try:
            with self._watcher_off() if self._embedded else contextlib.nullcontext():
                return super().fit()
        except KeyboardInterrupt:
            self._abort()
            raise

    def _register_sigint_handler(self, controller) -> None:
        """Ray Train's own SIGINT handler aborts the run and calls `sys.exit` (exit 1, a run
        recorded as failed) and replaces the command's handler for good. The command's handler
        stays instead; an interrupted `fit` aborts the controller itself (`_abort`)."""
        self._controller = controller

    def _abort(self) -> None:
        """Stop the run's workers on an attached cluster too (an embedded Ray ends anyway)."""
        import ray

        if self._controller is None or self._embedded:
            return
        with contextlib.suppress(Exception):
            ray.get(self._controller.abort.remote(), timeout=10)

    @contextlib.contextmanager
    def _watcher_off(self):
        if PREEMPTION_WATCHER_ENV in os.environ:
            yield
            return
        os.environ[PREEMPTION_WATCHER_ENV] = "0"
        try:
            yield
        finally:
            os.environ.pop(PREEMPTION_WATCHER_ENV, None)
