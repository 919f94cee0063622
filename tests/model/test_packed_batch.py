"""PackedBatch through `Transformer.forward`: decoding rows and prompt chunks of several sequences
side by side in one [1, T] forward (no pads) give each sequence the logits its own contiguous
`KVCache` row gives, step after step, with GQA and sliding windows; decoding runs are split
where padding would pass the bound; the engine runs one forward per step and decodes the
padded path's tokens."""

from __future__ import annotations

import pytest
import torch

from kiln.engine.engine import Engine
from kiln.engine.sampler import SamplingParams
from kiln.model import KVCache, packed_batch
from kiln.model.attention import AttentionCore
from kiln.model.packed_batch import _pieces
from kiln.model.paged_kv_cache import PagedKVCache
from tests.engine.conftest import one_torch_thread  # noqa: F401 - autouse: one torch thread
from tests.engine.tiny import tiny_generator, tiny_model, train_tokenizer


class Padded(Engine):
    """The engine with packing off (the padded forwards every step)."""

    def _packable(self, work) -> bool:
        return False


@pytest.mark.parametrize(
    ("shape", "overrides"),
    [("llama", {}), ("mistral", {}), ("mixtral", {}), ("llama", {"attn_logit_softcap": 30.0})],
)
def test_packed_rows_equal_contiguous_rows(shape, overrides):
    model = tiny_model(shape, 60, **overrides)
    torch.manual_seed(2)
    lengths = [9, 11, 7, 2]  # prompts: two arrive first, two join while the first two decode
    prompts = [torch.randint(0, 60, (n,)).tolist() for n in lengths]
    paged = PagedKVCache.for_model(model.cfg, num_blocks=40, block_size=4)
    tables = [[9, 3, 17, 5, 30, 12], [2, 21, 8, 33, 6, 14], [4, 25, 11, 38, 7, 20], [1, 36, 10]]
    done = [0, 0, 0, 0]  # tokens whose keys/values are cached
    seqs = [list(p) for p in prompts]
    logits = {}
    with torch.inference_mode():
        for step in range(5):
            # rows 0, 1 from step 0; rows 2, 3 from step 2 (row 2 prefilled in two chunks)
            rows = [r for r in range(4) if r < 2 or step >= 2]
            counts = []
            for r in rows:
                todo = len(seqs[r]) - done[r]
                counts.append(min(todo, 4) if r == 2 else todo)
            tokens = [t for r, n in zip(rows, counts, strict=True) for t in seqs[r][done[r] :][:n]]
            batch = paged.packed([tables[r] for r in rows], [done[r] for r in rows], counts)
            if step == 1:  # rows 0 and 1 decode as one [2, 1] attention
                assert [piece[1:3] for piece in batch.pieces] == [(2, 1)]
            ends = torch.tensor(counts).cumsum(0) - 1
            out = model(torch.tensor([tokens]), kv_cache=batch)[0, ends]
            for r, n, row_logits in zip(rows, counts, out, strict=True):
                done[r] += n
                if done[r] == len(seqs[r]):
                    logits[r] = row_logits
                    seqs[r].append(int(row_logits.argmax()))
        for r, seq in enumerate(seqs):
            want = model(torch.tensor([seq[:-1]]), kv_cache=KVCache.for_model(model.cfg, 1, 32))
            torch.testing.assert_close(logits[r], want[0, -1], rtol=1e-4, atol=1e-4)
            assert len(seq) > len(prompts[r]) + 1  # every row decoded past its prompt


def _mixed_step_logits(model) -> torch.Tensor:
    """Logits of one packed forward of three decoding rows and a prompt chunk, after their
    prompts' forwards."""
    torch.manual_seed(3)
    lengths, counts = [9, 6, 6, 3], [1, 1, 1, 5]
    tables = [[9, 3, 17], [2, 21], [4, 25], [1, 36, 10]]
    prompts = [torch.randint(0, 60, (n,)) for n in lengths]
    paged = PagedKVCache.for_model(model.cfg, num_blocks=40, block_size=4)
    with torch.inference_mode():
        for r in range(4):
            model(prompts[r][None], kv_cache=paged.packed([tables[r]], [0], [lengths[r]]))
        tokens = torch.randint(0, 60, (1, sum(counts)), generator=torch.Generator().manual_seed(0))
        return model(tokens, kv_cache=paged.packed(tables, lengths, counts))


@pytest.mark.parametrize("shape", ["llama", "mistral"])
def test_additive_masks_give_the_bool_masks_output_bit_for_bit(shape, monkeypatch):
    # PackedBatch hands SDPA float masks built once per forward; SDPA would build the same
    # from a bool mask on every call, so the logits must not move by a single bit
    model = tiny_model(shape, 60)
    assert AttentionCore(16).takes_additive_mask  # the SDPA core takes them by default
    monkeypatch.setattr(AttentionCore, "takes_additive_mask", False)
    bool_mask = _mixed_step_logits(model)
    monkeypatch.setattr(AttentionCore, "takes_additive_mask", True)
    assert torch.equal(bool_mask, _mixed_step_logits(model))


@pytest.mark.parametrize("shape", ["llama", "mistral"])
def test_invariant_bias_built_once_gives_the_bool_masks_output_bit_for_bit(shape, monkeypatch):
    # the batch-invariant attention gets its padded additive bias built once per forward; from
    # a bool mask it builds the same on every call, and RL's log-probs must not move a bit
    model = tiny_model(shape, 60, attention_backend="invariant")
    once = _mixed_step_logits(model)
    monkeypatch.setattr(packed_batch, "_mask_form", lambda core, dtype: None)
    assert torch.equal(once, _mixed_step_logits(model))


def test_decoding_runs_split_where_padding_passes_the_bound():
    # one-token rows longest first: 40 and 30 share a run, 12 starts its own; chunks stand alone
    assert _pieces([40, 30, 12, 11, 5], [1, 1, 1, 1, 3]) == [(0, 2), (2, 4), (4, 5)]
    assert _pieces([8, 6], [2, 1]) == [(0, 1), (1, 2)]
    # equal rows, but a run of 3 x 4000 slots would gather more than DECODE_RUN_KEYS
    assert _pieces([3999] * 5, [1] * 5) == [(0, 2), (2, 4), (4, 5)]


def test_the_engine_packs_each_step_into_one_forward_with_the_padded_paths_tokens():
    gen = tiny_generator("mistral", train_tokenizer(), eos=False)
    torch.manual_seed(3)
    prompts = [torch.randint(0, 60, (n,)).tolist() for n in (3, 17, 9, 30, 5, 12)]
    outputs, forwards = {}, {}
    for name, cls in (("packed", Engine), ("padded", Padded)):
        engine = cls(gen, max_slots=4, prefill_chunk=16, block_size=4)
        calls = []
        hook = gen.model.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        params = SamplingParams(max_new_tokens=6)
        requests = [engine.submit(p, params, lambda event: None) for p in prompts]
        for _ in engine.run(requests):
            pass
        hook.remove()
        outputs[name] = [r.seq.token_ids for r in requests]
        forwards[name] = (len(calls), engine.steps)
    assert outputs["packed"] == outputs["padded"]
    assert all(len(ids) == 6 for ids in outputs["packed"])
    calls, steps = forwards["packed"]
    assert calls == steps  # one forward per step
    assert forwards["padded"][0] > forwards["padded"][1]  # prefill groups + a decode forward
