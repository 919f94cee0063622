"""The batch-invariant attention backend: the same attention as SDPA (to fp32 rounding), and a
KV-cache decode through it gives logits bit-identical to one full forward, where SDPA's fused
kernel does not (the reason the backend exists: RL's engine-vs-trainer log-prob parity)."""

from __future__ import annotations

import pytest
import torch

from kiln.model import KVCache, ModelConfig, Transformer
from kiln.model.attention import AttentionCore, set_attention_backend
from kiln.model.batch_invariance import invariant_attention
from kiln.platform.errors import ConfigError

ROWS = 16  # a decode step of 16 rows: the matmuls' row count needs no padding (MIN_GEMM_ROWS)


def _qkv(batch=2, heads=4, kv_heads=2, seq=11, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, generator=g)
    k = torch.randn(batch, kv_heads, seq, dim, generator=g)
    v = torch.randn(batch, kv_heads, seq, dim, generator=g)
    return q, k, v


@pytest.mark.parametrize(
    "window,softcap,scale", [(None, None, None), (4, None, None), (None, 5.0, 0.3)]
)
def test_invariant_attention_equals_sdpa(window, softcap, scale):
    q, k, v = _qkv()
    reference = AttentionCore(16, window, "sdpa", scale=scale, softcap=softcap)
    invariant = AttentionCore(16, window, "invariant", scale=scale, softcap=softcap)
    torch.testing.assert_close(invariant(q, k, v), reference(q, k, v), atol=2e-6, rtol=0)
    # an explicit mask (a KV cache's: the last query sees every key but the final two)
    mask = torch.ones(1, 1, 1, 11, dtype=torch.bool)
    mask[..., -2:] = False
    torch.testing.assert_close(
        invariant(q[:, :, -1:], k, v, mask=mask),
        reference(q[:, :, -1:], k, v, mask=mask),
        atol=2e-6,
        rtol=0,
    )


def _model(backend: str, kv_heads: int = 1) -> Transformer:
    """Two layers with 64-wide heads (SmolLM2's head width), GQA (or MHA: one query row per
    key head in a decode)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=96, dim=128, n_layers=2, n_heads=2, n_kv_heads=kv_heads, ffn_hidden_dim=256,
        max_seq_len=128, attention_backend=backend,
    )  # fmt: skip
    return Transformer(cfg).eval()


def _decode_vs_full(model: Transformer) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of ROWS sequences of different prompt lengths decoded token by token from a KV
    cache, and the same positions from one full forward of every sequence."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 96, (ROWS, 40), generator=g)
    prompt = [5 + row % 7 for row in range(ROWS)]
    cache = KVCache.for_model(model.cfg, batch=ROWS, max_len=64)
    decoded = torch.zeros(ROWS, 40 - min(prompt), 96)
    with torch.no_grad():
        full = model(tokens)
        model(tokens[:, : max(prompt)], kv_cache=cache)  # ragged prefill, then truncated
        cache.truncate(torch.tensor(prompt))
        for step in range(40 - max(prompt)):
            at = torch.tensor(prompt) + step  # each row's next position
            logits = model(tokens[torch.arange(ROWS), at][:, None], kv_cache=cache)[:, -1]
            decoded[:, step] = logits
        expected = torch.stack(
            [full[row, prompt[row] : prompt[row] + 40 - max(prompt)] for row in range(ROWS)]
        )
    return decoded[:, : 40 - max(prompt)], expected


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["gqa", "mha"])
def test_a_kv_cache_decode_equals_the_full_forward_bit_for_bit(kv_heads):
    decoded, full = _decode_vs_full(_model("invariant", kv_heads))
    assert torch.equal(decoded, full)
    # SDPA's fused kernel, the same model otherwise, rounds the two differently
    decoded, full = _decode_vs_full(_model("sdpa", kv_heads))
    assert not torch.equal(decoded, full)
    torch.testing.assert_close(decoded, full, atol=1e-4, rtol=0)


def test_set_attention_backend_switches_every_core_and_the_config():
    model = _model("sdpa")
    set_attention_backend(model, "invariant")
    assert model.cfg.attention_backend == "invariant"
    assert {m.backend for m in model.modules() if isinstance(m, AttentionCore)} == {"invariant"}
    with pytest.raises(ConfigError, match="attention_backend"):
        set_attention_backend(model, "fast")


def test_a_prefix_of_one_to_three_keys_rounds_as_the_whole_sequence():
    """8-wide heads (the tiny test models') over 1-3 keys make products small enough
    (contraction x rows x columns < 400) for ATen's own bmm loop, which rounds unlike MKL's
    kernel. A short prompt's prefill (or a decode over it) must still equal the trainer's
    forward of the whole sequence at those positions, bit for bit."""
    q, k, v = _qkv(batch=1, seq=20, dim=8)
    full = invariant_attention(q, k, v, scale=8**-0.5)
    for n in (1, 2, 3, 4):
        prefill = invariant_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], scale=8**-0.5)
        assert torch.equal(prefill, full[:, :, :n]), n
        decode = invariant_attention(q[:, :, n - 1 : n], k[:, :, :n], v[:, :, :n], scale=8**-0.5)
        assert torch.equal(decode, full[:, :, n - 1 : n]), n
