"""One 2-node Ray cluster for the reliability tests that need nodes (module-scoped per module
that asks for it; shut down in the finalizer even when a test fails)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def two_nodes():
    from tests.reliability.cluster import TwoNodeCluster

    cluster = TwoNodeCluster(head_cpus=1, worker_cpus=1)
    try:
        yield cluster
    finally:
        cluster.shutdown()
