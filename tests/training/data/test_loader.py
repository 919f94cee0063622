"""The training loader: DP split, determinism, one pass covers the split, resume, synthetic data."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kiln.platform.errors import ConfigError, InputError
from kiln.text.indexed_dataset import IndexedDataset
from kiln.training.data import DataConfig, build_dataloader
from tests.training.data.helpers import write_unique_dataset

SEQ = 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    write_unique_dataset(root / "d", 300, 40, seed=4)
    return root


def _loader(data, dp_rank=0, dp_size=1, mbs=2, seed=1, prefetch=2):
    cfg = DataConfig(
        paths=[str(data / "d")], index_cache_dir=str(data / "cache"), prefetch=prefetch
    )
    return build_dataloader(
        cfg, seq_len=SEQ, micro_batch_size=mbs, dp_rank=dp_rank, dp_size=dp_size, seed=seed
    )


def _take(loader, n):
    return [(t.clone(), lab.clone()) for t, lab in itertools.islice(loader, n)]


def test_batches_are_shifted_int64_pairs(data):
    tokens, labels = next(_loader(data))
    assert tokens.shape == labels.shape == (2, SEQ)
    assert tokens.dtype == labels.dtype == torch.int64
    torch.testing.assert_close(tokens[:, 1:], labels[:, :-1])


def test_deterministic_and_prefetch_changes_nothing(data):
    a = _take(_loader(data, prefetch=3), 12)
    b = _take(_loader(data, prefetch=0), 12)
    c = _take(_loader(data, seed=2), 12)
    for (ta, la), (tb, lb) in zip(a, b, strict=False):
        assert torch.equal(ta, tb) and torch.equal(la, lb)
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c, strict=False))


def test_dp_ranks_split_one_pass_and_cover_every_token_once(data):
    ds = IndexedDataset(data / "d")
    dp, mbs = 3, 2
    loaders = [_loader(data, r, dp, mbs) for r in range(dp)]
    per_pass = loaders[0].source.pass_length
    steps = -(-per_pass // (dp * mbs))
    seen: dict[int, np.ndarray] = {}
    for step in range(steps):
        for _r, loader in enumerate(loaders):
            ids = loader.sample_ids(step)
            tokens, _ = next(loader)
            for j, row in zip(ids, tokens.numpy(), strict=False):
                assert j not in seen  # no sample reaches two ranks
                seen[int(j)] = row
    epoch = np.concatenate([seen[j] for j in range(per_pass)])
    assert len(np.unique(epoch)) == len(epoch) == per_pass * SEQ  # each token once as an input
    assert ds.num_tokens - len(epoch) <= SEQ  # all but the dropped partial sample


@pytest.mark.parametrize("dp_size", [1, 2, 4])
def test_resume_at_step_k_sees_the_uninterrupted_batches(data, dp_size):
    total = 54  # ~375 samples a pass: at dp >= 2 the later k resume in the second or third pass
    reference = [_take(_loader(data, r, dp_size, mbs=4), total) for r in range(dp_size)]
    for k in (0, 1, 7, 50):
        for r in range(dp_size):
            first = _loader(data, r, dp_size, mbs=4)
            _take(first, k)
            state = first.state_dict()
            resumed = _loader(data, r, dp_size, mbs=4)
            resumed.load_state_dict(state)
            for (t, lab), (rt, rl) in zip(_take(resumed, 4), reference[r][k : k + 4], strict=False):
                assert torch.equal(t, rt) and torch.equal(lab, rl)


def test_resume_with_a_different_dp_size(data):
    """State is global samples consumed, so 2 ranks x 2 samples resume as 1 rank x 4 samples."""
    two = [_loader(data, r, 2, mbs=2) for r in range(2)]
    for loader in two:
        _take(loader, 5)
    after = [_take(loader, 3) for loader in two]
    one = _loader(data, 0, 1, mbs=4)
    one.load_state_dict(two[0].state_dict() | {"samples_consumed": 5 * 4})
    for step, (t, _) in enumerate(_take(one, 3)):
        assert torch.equal(t, torch.cat([after[0][step][0], after[1][step][0]]))


def test_state_counts_delivered_batches_not_prefetched_ones(data):
    loader = _loader(data, prefetch=4)
    _take(loader, 3)
    assert loader.state_dict()["samples_consumed"] == 3 * 2
    loader.close()


def test_blended_paths(data, tmp_path):
    write_unique_dataset(tmp_path / "other", 300, 40, seed=9, base=1 << 24)
    cfg = DataConfig(
        paths=[str(data / "d"), str(tmp_path / "other")],
        weights=[1, 3],
        index_cache_dir=str(tmp_path),
    )
    loader = build_dataloader(cfg, seq_len=SEQ, micro_batch_size=8, dp_rank=0, dp_size=1, seed=0)
    tokens = torch.cat([t for t, _ in _take(loader, 5)])
    assert (tokens[:, 0] >= (1 << 24)).sum().item() == 30  # 3/4 of 40 samples


def test_synthetic_data_same_api(data):
    cfg = DataConfig(synthetic=True)
    a = build_dataloader(
        cfg, seq_len=SEQ, micro_batch_size=2, dp_rank=1, dp_size=2, seed=3, vocab_size=50
    )
    batches = _take(a, 4)
    assert all(t.max() < 50 and t.min() >= 0 for t, _ in batches)
    b = build_dataloader(
        cfg, seq_len=SEQ, micro_batch_size=2, dp_rank=1, dp_size=2, seed=3, vocab_size=50
    )
    _take(b, 2)
    c = build_dataloader(
        cfg, seq_len=SEQ, micro_batch_size=2, dp_rank=1, dp_size=2, seed=3, vocab_size=50
    )
    c.load_state_dict(b.state_dict())
    assert all(torch.equal(x[0], y[0]) for x, y in zip(_take(c, 2), batches[2:], strict=False))
    with pytest.raises(ConfigError, match="vocab_size"):
        build_dataloader(cfg, seq_len=SEQ, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0)


def test_bad_paths_are_user_errors(tmp_path):
    with pytest.raises(InputError, match="neither a TokenDataset"):
        build_dataloader(
            DataConfig(paths=[str(tmp_path / "nope")]),
            seq_len=8,
            micro_batch_size=1,
            dp_rank=0,
            dp_size=1,
            seed=0,
        )
    with pytest.raises(ConfigError, match="data.paths"):
        build_dataloader(DataConfig(), seq_len=8, micro_batch_size=1, dp_rank=0, dp_size=1, seed=0)


def test_a_dropped_loader_stops_its_prefetch_thread(data):
    import gc
    import threading

    loader = _loader(data, prefetch=2)
    next(loader)
    thread = loader._thread
    del loader
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert not any(t.name == "kiln-prefetch" and t is thread for t in threading.enumerate())


def test_too_little_data_is_a_user_error(tmp_path):
    write_unique_dataset(tmp_path / "tiny", 2, 5)
    cfg = DataConfig(paths=[str(tmp_path / "tiny")], index_cache_dir=str(tmp_path))
    with pytest.raises(InputError, match="cannot fill one sample"):
        build_dataloader(cfg, seq_len=64, micro_batch_size=1, dp_rank=0, dp_size=1, seed=0)
