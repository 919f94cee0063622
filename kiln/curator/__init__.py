"""kiln.curator: read, clean, filter and deduplicate text corpora (Ray actors + Dask).

from kiln.curator import CurateConfig, curate
report = curate(CurateConfig(input=["data/*.jsonl.zst"]), "out/corpus")
"""

from kiln.curator.config import CurateConfig
from kiln.platform.imports import lazy_exports

EXPORTS = {
    "DocBatch": "kiln.curator.filters.batch:DocBatch",
    "DocumentFilter": "kiln.curator.filters.base:DocumentFilter",
    "curate": "kiln.curator.pipeline:curate",
}
__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = ["CurateConfig", *EXPORTS]
