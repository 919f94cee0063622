"""Held-out perplexity on a TokenDataset split equals transformers' on the Hugging Face export."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kiln.platform.errors import InputError
from tests.serving.rest.tiny_model import make_tiny_model

SEQ_LEN = 48
DOC_LENGTHS = (40, 75, 12, 90, 33, 61, 50)


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory) -> str:
    return make_tiny_model(str(tmp_path_factory.mktemp("ppl") / "model"), max_seq_len=64)


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory) -> str:
    """A TokenDataset with a `valid` split: 7 documents of random ids, each ending in EOD (0)."""
    from kiln.text.indexed_dataset import IndexedDatasetWriter

    out = tmp_path_factory.mktemp("tokens")
    with IndexedDatasetWriter(out / "valid", dtype=np.uint16) as w:
        for doc in _documents():
            w.add_document(doc)
    return str(out)


def _documents() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.append(rng.integers(1, 320, n), 0) for n in DOC_LENGTHS]


def _reference(hf_dir: str, tokens: np.ndarray, seq_len: int) -> tuple[float, int]:
    """transformers' LlamaForCausalLM over the same non-overlapping windows: (mean NLL, count)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    size = seq_len + 1
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(tokens) - size + 1, size):
            window = torch.tensor(tokens[start : start + size], dtype=torch.long)[None]
            logits = model(window[:, :-1]).logits
            total += float(
                torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum")
            )
            count += seq_len
    return total / count, count


def test_perplexity_equals_transformers_on_the_export(tiny_export, tokens_dir):
    from kiln.evaluate.perplexity import dataset_perplexity, split_tokens

    got = dataset_perplexity(tiny_export, tokens_dir, seq_len=SEQ_LEN, batch_size=3)
    tokens = split_tokens(tokens_dir, "valid")
    np.testing.assert_array_equal(tokens, np.concatenate(_documents()))  # all, in order
    nll, count = _reference(tiny_export, tokens, SEQ_LEN)
    assert got.tokens == count == (len(tokens) // (SEQ_LEN + 1)) * SEQ_LEN
    assert got.perplexity == pytest.approx(math.exp(nll), rel=1e-4)
    assert got.perplexity > 1


def test_perplexity_errors_name_the_problem(tiny_export, tokens_dir):
    from kiln.evaluate.perplexity import dataset_perplexity

    with pytest.raises(InputError, match=r"test\.bin/\.idx not found"):
        dataset_perplexity(tiny_export, tokens_dir, split="test")
    with pytest.raises(InputError, match="exceeds the model's context"):
        dataset_perplexity(tiny_export, tokens_dir, seq_len=4096)
