"""Ray Train's `TorchTrainer` without the helper actors a kiln run never uses.

Beside its workers, each Ray Train worker group brings a controller and helper actors, each one
a process that imports ray.train (~4 CPU s on a laptop core). kiln never hands Ray Train a
dataset (its loader reads the token files itself), so the DatasetManager actor is left out; on an
embedded Ray, which ends with its driver, so is the PlacementGroupCleaner (it removes a run's
placement group when the controller dies and the cluster lives on). The helpers are found by
class name: a Ray that renames them keeps them, which costs time, never correctness.
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer


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
