"""Where the dedup runs: Dask with pandas (threads) or cuDF (dask-cuda LocalCUDACluster), and the
same graph on a Ray cluster through Dask-on-Ray (`cluster: ray`)."""

from __future__ import annotations

import contextlib
import logging
import os

from kiln.platform.errors import ConfigError

log = logging.getLogger("kiln.curator")


# What the cuDF backend imports: cuDF for MinHash, dask-cudf registers Dask's "cudf" dataframe
# backend (without it `dd.read_parquet` fails with "No backend dispatch registered for cudf"),
# dask-cuda starts the local GPU cluster (Dask-on-Ray needs no dask-cuda).
_GPU_MODULES = ("cudf", "dask_cudf")
_LOCAL_GPU_MODULES = ("dask_cuda", "rmm")


def missing_gpu_modules(cluster: str = "local") -> list[str]:
    """The modules the cuDF backend needs on `cluster` that cannot be imported here."""
    import importlib.util

    needed = _GPU_MODULES + (_LOCAL_GPU_MODULES if cluster != "ray" else ())
    return [m for m in needed if importlib.util.find_spec(m) is None]


def cugraph_available() -> bool:
    """cuGraph is optional: without it the components run on scipy (CPU)."""
    import importlib.util

    return importlib.util.find_spec("cugraph") is not None


def gpu_available(cluster: str = "local") -> bool:
    if missing_gpu_modules(cluster):
        return False
    import torch

    return torch.cuda.is_available()


def resolve_backend(backend: str, cluster: str = "local") -> str:
    if backend == "auto":
        return "cudf" if gpu_available(cluster) else "pandas"
    if backend == "cudf" and not gpu_available(cluster):
        missing = ", ".join(missing_gpu_modules(cluster)) or "a visible CUDA device"
        raise ConfigError(
            f"curate.backend: 'cudf' needs CUDA and {missing} (pip install 'kiln[gpu]')"
        )
    return backend


@contextlib.contextmanager
def dask_session(
    backend: str,
    cluster: str,
    rmm_async: bool = True,
    rmm_release_threshold: str | None = None,
    spill_dir: str | None = None,
):
    """Configure Dask for the dedup graph; yields the resolved backend name.

    On one machine's threads the shuffles go through disk (partd), into `spill_dir`, so the LSH
    buckets of millions of documents never sit in memory at once; the spill lands next to the
    output rather than in a /tmp that may be RAM. Ray and dask-cuda workers shuffle as tasks."""
    import dask

    local_pandas = cluster != "ray" and backend != "cudf"
    settings = {
        "dataframe.shuffle.method": "disk" if local_pandas else "tasks",
        "dataframe.convert-string": False,
    }
    if local_pandas and spill_dir:
        os.makedirs(spill_dir, exist_ok=True)
        settings["temporary_directory"] = spill_dir
    with contextlib.ExitStack() as stack:
        if cluster == "ray":
            from ray.util.dask import ray_dask_get

            settings["scheduler"] = ray_dask_get
        elif backend == "cudf":
            from dask.distributed import Client
            from dask_cuda import LocalCUDACluster

            cuda = stack.enter_context(
                LocalCUDACluster(rmm_async=rmm_async, rmm_release_threshold=rmm_release_threshold)
            )
            stack.enter_context(Client(cuda))
        else:
            settings["scheduler"] = "threads"
        if backend == "cudf":
            settings["dataframe.backend"] = "cudf"
        stack.enter_context(dask.config.set(settings))
        log.info("dedup on Dask: backend=%s cluster=%s", backend, cluster)
        yield backend
