"""Which GPU pieces the curator uses, decided on CPU: the cuDF backend needs dask-cudf (Dask's
"cudf" dataframe backend), cuGraph is optional, dask-cuda's RMM settings are validated up front."""

from __future__ import annotations

import pandas as pd
import pytest

from kiln.curator.config import CurateConfig
from kiln.curator.dedup import engine
from kiln.curator.dedup.components import duplicates_from_edges
from kiln.platform.errors import ConfigError


def _fake_installed(tmp_path, monkeypatch, *modules: str) -> None:
    """Importable (empty) packages: enough for the import checks, which never import them."""
    for name in modules:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_cudf_without_dask_cudf_is_not_a_gpu_backend(tmp_path, monkeypatch):
    _fake_installed(tmp_path, monkeypatch, "cudf", "dask_cuda", "rmm")
    assert engine.missing_gpu_modules("local") == ["dask_cudf"]
    assert engine.resolve_backend("auto") == "pandas"
    with pytest.raises(ConfigError, match="dask_cudf"):
        engine.resolve_backend("cudf")


def test_dask_on_ray_does_not_need_dask_cuda(tmp_path, monkeypatch):
    _fake_installed(tmp_path, monkeypatch, "cudf", "dask_cudf")
    assert engine.missing_gpu_modules("ray") == []
    assert engine.missing_gpu_modules("local") == ["dask_cuda", "rmm"]


def test_components_fall_back_to_scipy_without_cugraph():
    assert not engine.cugraph_available()  # no cuGraph on the CPU image
    edges = pd.DataFrame(
        {"a_row": [1, 2, 10], "a_id": ["b", "c", "x"], "b_row": [2, 3, 11], "b_id": ["c", "a", "y"]}
    )
    rows, clusters = duplicates_from_edges(edges, use_cugraph=engine.cugraph_available())
    assert rows.tolist() == [1, 2, 11] and clusters == 2  # keeps "a" (row 3) and "x" (row 10)


def test_rmm_release_threshold_needs_the_async_pool():
    assert CurateConfig(rmm_async=False).rmm_release_threshold is None  # default dropped
    assert CurateConfig().rmm_release_threshold == "10GB"
    with pytest.raises(ConfigError, match="rmm_release_threshold"):
        CurateConfig(rmm_async=False, rmm_release_threshold="4GB")
