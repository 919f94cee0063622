"""Which worker counts an elastic run may use: whole tp/pp/cp groups, the global batch kept."""

from __future__ import annotations

import pytest

from kiln.platform.errors import ConfigError
from kiln.training.config import TrainConfig
from kiln.training.elastic import ElasticConfig, valid_worker_counts


def _cfg(**parallel) -> TrainConfig:
    return TrainConfig.model_validate(
        {"parallel": parallel, "global_batch_size": 8, "micro_batch_size": 2}
    )


def test_counts_are_whole_model_parallel_groups_largest_first():
    elastic = ElasticConfig(min_workers=1, max_workers=8)
    assert valid_worker_counts(_cfg(tp=2), elastic) == [8, 4, 2]  # 6: dp=3 splits no batch of 8
    assert valid_worker_counts(_cfg(tp=2, pp=2), elastic) == [8, 4]
    assert valid_worker_counts(_cfg(), ElasticConfig(min_workers=3, max_workers=5)) == [4]


def test_impossible_elastic_ranges_are_config_errors():
    with pytest.raises(ConfigError, match="min_workers"):
        ElasticConfig(min_workers=4, max_workers=2)
    with pytest.raises(ConfigError, match="multiple of pp"):
        valid_worker_counts(_cfg(tp=4), ElasticConfig(min_workers=2, max_workers=3))
    with pytest.raises(ConfigError, match="dp_shard"):
        valid_worker_counts(_cfg(dp_shard=2), ElasticConfig(min_workers=2, max_workers=4))
