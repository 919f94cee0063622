"""The paged attention op (kiln/model/paged_attention.py): decode attention read in place from
the block pool equals the same attention in plain torch (fp32 and bf16, GQA, sliding windows,
scattered blocks, rows of one key to several blocks); packed decoding through it gives the
logits of the gather path and of a contiguous KVCache; the engine's greedy tokens are the same
with the op and without; where the op cannot be built it says so and the gather path runs."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch

from kiln.engine.engine import Engine
from kiln.engine.sampler import SamplingParams
from kiln.model import KVCache, native_ops, paged_attention
from kiln.model.paged_kv_cache import PagedKVCache
from tests.engine.conftest import one_torch_thread  # noqa: F401 - autouse: one torch thread
from tests.engine.tiny import tiny_generator, tiny_model, train_tokenizer

TOOLCHAIN = shutil.which("c++") is not None  # ninja is a dependency (its wheel)


@pytest.fixture
def op():
    """The op, which must build wherever a C++ compiler is found."""
    if not TOOLCHAIN or os.environ.get(paged_attention.ENV, "").lower() == "torch":
        pytest.skip("no C++ compiler here (or the op is switched off)")
    assert paged_attention.available()


@pytest.fixture
def counted(monkeypatch):
    """Calls of the op made through PackedBatch."""
    calls = []
    decode = paged_attention.decode

    def counting(*args, **kwargs):
        calls.append(args[0].shape[0])
        return decode(*args, **kwargs)

    monkeypatch.setattr(paged_attention, "decode", counting)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("window", [None, 6])
def test_the_op_equals_attention_in_torch(op, dtype, head_dim, window):
    gen = torch.Generator().manual_seed(head_dim)
    blocks, bs, kv_heads, group = 100, 4, 2, 3
    k_pool = torch.randn(blocks, bs, kv_heads, head_dim, generator=gen).to(dtype)
    v_pool = torch.randn(blocks, bs, kv_heads, head_dim, generator=gen).to(dtype)
    lengths = torch.tensor([37, 1, 4, 5, 64, 18])  # a row of one key, exact and partial blocks
    table = torch.randperm(blocks - 1, generator=gen)[: 6 * 16].view(6, 16) + 1
    q = torch.randn(6, kv_heads, group, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    got = paged_attention.decode(q, k_pool, v_pool, table, lengths, scale, window)
    want = paged_attention.decode_reference(q, k_pool, v_pool, table, lengths, scale, window)
    # and the reference against SDPA over each row's keys laid out contiguously
    for r in (0, 4):
        n = int(lengths[r])
        first = max(0, n - window) if window else 0
        pos = torch.arange(first, n)
        slots = table[r, pos // bs] * bs + pos % bs
        keys = k_pool.flatten(0, 1)[slots].transpose(0, 1).float()
        values = v_pool.flatten(0, 1)[slots].transpose(0, 1).float()
        sdpa = torch.nn.functional.scaled_dot_product_attention(q[r].float(), keys, values)
        tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16: one rounding of the result
        torch.testing.assert_close(want[r].float(), sdpa, rtol=tol, atol=tol)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def _decode_logits(model, in_place: bool, steps: int = 3) -> list[torch.Tensor]:
    """Four prompts prefilled, then `steps` packed decode steps of all four rows; the logits."""
    torch.manual_seed(4)
    lengths = [21, 9, 14, 3]
    prompts = [torch.randint(0, 60, (n,)).tolist() for n in lengths]
    dtype = next(model.parameters()).dtype
    paged = PagedKVCache.for_model(model.cfg, num_blocks=48, block_size=4, dtype=dtype)
    tables = [list(range(1 + 10 * r, 11 + 10 * r))[::-1] for r in range(4)]  # scattered
    out = []
    with torch.inference_mode():
        for r, prompt in enumerate(prompts):  # all but the last token, which the first step feeds
            prefix = prompt[:-1]
            model(torch.tensor([prefix]), kv_cache=paged.packed([tables[r]], [0], [len(prefix)]))
        tokens = [p[-1] for p in prompts]
        done = [n - 1 for n in lengths]
        for _ in range(steps):
            batch = paged.packed(tables, done, [1] * 4, in_place=in_place)
            logits = model(torch.tensor([tokens]), kv_cache=batch)[0]
            out.append(logits)
            tokens = logits.argmax(-1).tolist()
            done = [n + 1 for n in done]
    return out, prompts


@pytest.mark.parametrize(
    ("shape", "overrides", "through_op"),
    [
        ("llama", {}, True),
        ("mistral", {}, True),  # sliding window 5 on every layer
        ("llama", {"attn_logit_softcap": 30.0}, False),  # soft-capped: the gather path
    ],
)
def test_packed_decoding_in_place_equals_the_gather_path(op, counted, shape, overrides, through_op):
    model = tiny_model(shape, 60, dim=128, **overrides)  # 4 heads of 32, 2 kv heads
    in_place, prompts = _decode_logits(model, True)
    assert len(counted) == (3 * model.cfg.n_layers if through_op else 0)
    assert all(rows == 4 for rows in counted)  # one piece: no padding bound to split at
    gathered, _ = _decode_logits(model, False)
    assert len(counted) == (3 * model.cfg.n_layers if through_op else 0)
    for a, b in zip(in_place, gathered, strict=True):  # the same sums in another order
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # the last step's logits against each sequence's contiguous KVCache forward
    seqs = [list(p) for p in prompts]
    for step in in_place[:-1]:
        for seq, token in zip(seqs, step.argmax(-1).tolist(), strict=True):
            seq.append(token)
    for r, seq in enumerate(seqs):
        want = model(torch.tensor([seq]), kv_cache=KVCache.for_model(model.cfg, 1, 48))
        torch.testing.assert_close(in_place[-1][r], want[0, -1], rtol=1e-4, atol=1e-4)


def test_bf16_decoding_in_place_keeps_the_greedy_tokens_and_is_nearer_fp32(op, counted):
    model = tiny_model("llama", 60, dim=128).to(torch.bfloat16)
    in_place, _ = _decode_logits(model, True, steps=4)
    gathered, _ = _decode_logits(model, False, steps=4)
    exact, _ = _decode_logits(model.float(), False, steps=4)  # the same weights in fp32
    assert counted
    op_error, gather_error = 0.0, 0.0
    for a, b, want in zip(in_place, gathered, exact, strict=True):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        assert torch.equal(a.argmax(-1), want.argmax(-1))
        op_error = max(op_error, (a.float() - want).abs().max().item())
        gather_error = max(gather_error, (b.float() - want).abs().max().item())
    # the op keeps the softmax weights in fp32, where SDPA rounds them to bf16 before the sum
    # over values: its logits are no further from fp32's
    assert op_error <= gather_error


def test_the_engine_gives_the_same_greedy_tokens_with_and_without_the_op(op, counted, monkeypatch):
    gen = tiny_generator("mistral", train_tokenizer(), eos=False, dim=128)
    torch.manual_seed(5)
    prompts = [torch.randint(0, 60, (n,)).tolist() for n in (3, 17, 9, 30, 5, 12)]
    outputs = {}
    for name in ("op", "gather"):
        if name == "gather":
            monkeypatch.setitem(
                native_ops._loaded, "paged_attention", False
            )  # as without a compiler
            counted.clear()
        engine = Engine(gen, max_slots=4, prefill_chunk=16, block_size=4)
        params = SamplingParams(max_new_tokens=8)
        requests = [engine.submit(p, params, lambda event: None) for p in prompts]
        for _ in engine.run(requests):
            pass
        outputs[name] = [r.seq.token_ids for r in requests]
        assert bool(counted) == (name == "op")
    assert outputs["op"] == outputs["gather"]
    assert all(len(ids) == 8 for ids in outputs["op"])


def test_without_a_toolchain_the_op_is_unavailable_and_packing_gathers(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(native_ops, "_loaded", {})
    monkeypatch.setattr(native_ops, "BUILD_DIR", str(tmp_path))  # nothing built there
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler, no ninja
    with caplog.at_level(logging.WARNING, logger=native_ops.__name__):
        assert not paged_attention.available()
    assert "paged attention op unavailable" in caplog.text
    model = tiny_model("llama", 60, dim=128)
    paged = PagedKVCache.for_model(model.cfg, num_blocks=8, block_size=4)
    assert not paged.packed([[1], [2]], [2, 3], [1, 1]).in_place
    with pytest.raises(RuntimeError, match="unavailable"):
        paged_attention.decode(torch.zeros(1, 1, 1, 32), *paged.k[0:1], paged.v[0], None, None, 1)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(native_ops, "_loaded", {})
    monkeypatch.setenv(paged_attention.ENV, "torch")
    assert not paged_attention.available()
