"""One 2-node Ray cluster (tests/reliability/cluster.py) shared by every test that needs nodes:
built by the first, shut down after the last (or at the session's end when a test fails). A test
that killed the worker node leaves it to the next one to restart (seconds), not to rebuild the
cluster; `tests/conftest.py` orders the block so that one cluster serves it all."""

from __future__ import annotations

import pytest

_cluster = None


def _shared():
    global _cluster
    if _cluster is None:
        from tests.reliability.cluster import TwoNodeCluster

        _cluster = TwoNodeCluster(head_cpus=1, worker_cpus=1)
    return _cluster


@pytest.fixture
def two_nodes():
    """The shared cluster with both nodes up: its worker node restarted if an earlier test
    killed it (a new raylet, as a machine that comes back)."""
    cluster = _shared()
    if cluster.worker is None:
        cluster.start_worker_node()
    return cluster


@pytest.fixture
def two_nodes_never_lost(two_nodes):
    """The shared cluster, rebuilt if it ever lost a node: on a cluster whose worker node was
    killed and restarted, Ray Data actors created by a new driver were destroyed as soon as
    registered ("all references removed", Ray's; Ray Train and jobs ran fine there). Its users
    run before the tests that kill a node (tests/conftest.py), so no rebuild happens in a run."""
    if two_nodes.node_killed:
        _shutdown_cluster()
        return _shared()
    return two_nodes


def _shutdown_cluster() -> None:
    global _cluster
    if _cluster is not None:
        _cluster, cluster = None, _cluster
        cluster.shutdown()


def pytest_runtest_teardown(item, nextitem):
    """Shut the cluster down after the last test that uses it, not at the end of the suite: its
    users run back to back (tests/conftest.py orders them), on one xdist worker, whose
    `session.items` is the whole collection, so the next item is what tells."""
    if nextitem is None or "two_nodes" not in getattr(nextitem, "fixturenames", ()):
        _shutdown_cluster()


def pytest_sessionfinish(session, exitstatus):
    _shutdown_cluster()
