import numpy as np
import pytest

from kiln.training.data.piece_copy import copy_pieces


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint8])
def test_pieces_are_concatenated_and_widened(dtype):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, np.iinfo(dtype).max, 10_000, endpoint=True).astype(dtype)
    starts = rng.integers(0, 9_000, 40).astype(np.int64)
    lengths = rng.integers(0, 900, 40).astype(np.int64)
    expected = np.concatenate([tokens[s : s + n] for s, n in zip(starts, lengths, strict=False)])
    out = np.full(int(lengths.sum()), -1, dtype=np.int64)
    copy_pieces(tokens, starts, lengths, out)
    np.testing.assert_array_equal(out, expected.astype(np.int64))  # no wrap-around when widening


def test_two_dimensional_out_is_filled_row_major():
    tokens = np.arange(100, dtype=np.uint16)
    out = np.empty((2, 5), dtype=np.int64)
    copy_pieces(tokens, np.array([90, 0, 50]), np.array([3, 4, 3]), out)
    assert out.tolist() == [[90, 91, 92, 0, 1], [2, 3, 50, 51, 52]]


@pytest.mark.parametrize(
    ("starts", "lengths", "room"),
    [
        ([95], [10], 10),  # piece runs past the end of the token array
        ([-5], [3], 3),  # negative offset
        ([0, 10], [5, 5], 8),  # pieces longer than out
        ([0], [4], 8),  # pieces shorter than out
    ],
)
def test_bad_pieces_raise_and_never_write_past_out(starts, lengths, room):
    tokens = np.arange(100, dtype=np.uint16)
    buf = np.full(room + 4, -7, dtype=np.int64)
    with pytest.raises(ValueError, match="document pieces hold"):
        copy_pieces(tokens, np.array(starts, np.int64), np.array(lengths, np.int64), buf[:room])
    assert (buf[room:] == -7).all()


def test_non_contiguous_out_is_refused():
    out = np.empty((4, 4), dtype=np.int64)[:, :2]
    with pytest.raises(ValueError, match="C-contiguous"):
        copy_pieces(np.arange(10, dtype=np.uint16), np.array([0]), np.array([8]), out)
