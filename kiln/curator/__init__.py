"""kiln.curator: read, clean, filter and deduplicate text corpora (Ray Data + Dask).

from kiln.curator import CurateConfig, curate
report = curate(CurateConfig(input=["data/*.jsonl.zst"]), "out/corpus")
"""

from kiln.curator.config import CurateConfig
from kiln.curator.filters.base import DocumentFilter
from kiln.curator.filters.batch import DocBatch


def curate(cfg, output_dir, extra_filters=(), runtime=None):
    from kiln.curator.pipeline import curate as _curate

    return _curate(cfg, output_dir, extra_filters, runtime)


__all__ = ["CurateConfig", "DocBatch", "DocumentFilter", "curate"]
