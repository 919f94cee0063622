"""Engine tests step tiny (32-wide) models: they gain nothing from intra-op threads, and on a
loaded 2-core machine the threads' hand-offs cost ~40x the work itself (measured: 300 requests
through the engine took 10.9 s of wall time with 2 torch threads beside busy processes, 0.24 s
with one). Every test here runs with one torch thread, restored afterwards."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
