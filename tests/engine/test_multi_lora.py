"""Multi-LoRA in the engine: two PEFT adapters and the base served together, rows of different
adapters in one forward, each request's greedy tokens equal to a plain engine on the merged
weights of its own adapter (base rows equal to the base); prefix caching keyed by the adapter;
an LRU of adapter slots smaller than the adapters asked for; removal while a request runs; bad
adapters refused with the field named."""

from __future__ import annotations

import copy
import json
import random
import shutil

import pytest
import torch

from kiln.engine import Engine
from kiln.engine.generator import Generator
from kiln.engine.lora_batch import RowSlots, add_lora
from kiln.engine.lora_registry import UnknownAdapter
from kiln.engine.sampler import SamplingParams
from kiln.model.lora import LoRAConfig
from kiln.model.quantize import quantize_model
from kiln.platform.errors import InputError
from tests.engine.lora_fixtures import make_adapter
from tests.engine.tiny import tiny_model, train_tokenizer

NEW = 10
ADAPTERS = {  # different ranks and targets: zero-padded ranks, layers only one adapter adapts
    "alpha": LoRAConfig(rank=4, alpha=8, targets="all-linear"),
    "beta": LoRAConfig(rank=8, alpha=8, targets=["wq", "wv", "w2"]),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(base generator, {adapter name: folder}, {name or None: generator of the merged model})."""
    tok = train_tokenizer()
    base = tiny_model("llama", tok.get_vocab_size(), max_seq_len=256)
    root = tmp_path_factory.mktemp("loras")
    folders, refs = {}, {None: Generator(base, tok, eos_token_ids=[])}
    for seed, (name, cfg) in enumerate(ADAPTERS.items(), start=1):
        folders[name] = str(root / name)
        merged = make_adapter(base, cfg, folders[name], seed)
        refs[name] = Generator(merged, tok, eos_token_ids=[])
    return Generator(base, tok, eos_token_ids=[]), folders, refs


def prompts(n: int, seed: int = 0, vocab: int = 320) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def lora_engine(setup, max_loras: int = 2, **options) -> Engine:
    base, folders, _ = setup
    engine = Engine(base, max_loras=max_loras, **options)
    for name, folder in folders.items():
        engine.loras.add(name, folder)
    return engine


def run(engine: Engine, jobs: list[tuple[list[int], str | None]]) -> list[list[int]]:
    greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    requests = [engine.submit(ids, greedy, lambda e: None, lora=lora) for ids, lora in jobs]
    for _ in engine.run(requests):
        pass
    for r in requests:
        assert r.error is None, r.error
    return [r.seq.token_ids for r in requests]


def reference(setup, jobs) -> list[list[int]]:
    refs = setup[2]
    greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    return [refs[lora].generate_ids([ids], greedy)[0] for ids, lora in jobs]


def test_adapters_and_base_in_one_batch_equal_their_merged_models(setup):
    jobs = [(ids, [None, "alpha", "beta"][i % 3]) for i, ids in enumerate(prompts(12))]
    want = reference(setup, jobs)
    # the adapters change the model: equal outputs would prove nothing
    base_out = reference(setup, [(ids, None) for ids, _ in jobs])
    assert sum(w != b for w, b in zip(want, base_out, strict=True)) >= 6
    engine = lora_engine(setup, max_slots=12)
    got = run(engine, jobs)
    assert got == want
    slots = engine.loras.slots
    assert slots.mixed_forwards > 0  # rows of both adapters (and the base) shared forwards
    assert slots.loads == 2 and slots.evictions == 0


def test_prefix_cache_is_keyed_by_the_adapter(setup):
    """One 40-token prompt, first as the base, then under each adapter, then again: a cache
    shared across adapters would hand the adapters the base's keys/values."""
    ids = prompts(1, seed=3)[0] + prompts(1, seed=4)[0] + list(range(40))
    engine = lora_engine(setup, max_slots=4)
    sequence = [None, "alpha", "beta", "alpha"]
    got = [run(engine, [(ids, lora)])[0] for lora in sequence]
    assert got == reference(setup, [(ids, lora) for lora in sequence])
    stats = engine.kv.stats
    full = (len(ids) - 1) // engine.kv.block_size * engine.kv.block_size
    assert stats.hits == full  # only alpha's second request found its own prefix


def test_slots_fewer_than_adapters_evict_the_idle_one(setup):
    """One slot, requests of both adapters and the base at once: an adapter's requests wait
    for the slot while the other's run, and every answer is still its adapter's."""
    jobs = [(ids, ["alpha", None, "beta"][i % 3]) for i, ids in enumerate(prompts(9, seed=5))]
    engine = lora_engine(setup, max_loras=1, max_slots=9)
    assert run(engine, jobs) == reference(setup, jobs)
    slots = engine.loras.slots
    assert slots.evictions >= 1 and slots.mixed_forwards == 0
    assert engine.stats()["lora_slot_loads"] == slots.loads >= 2


def test_removing_an_adapter_fails_no_request_already_submitted(setup):
    engine = lora_engine(setup)
    ids = prompts(1, seed=7)[0]
    greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    request = engine.submit(ids, greedy, lambda e: None, lora="beta")
    engine.loras.remove("beta")
    for _ in engine.run([request]):
        pass
    assert request.error is None
    assert request.seq.token_ids == reference(setup, [(ids, "beta")])[0]
    with pytest.raises(UnknownAdapter, match="'beta'"):
        engine.submit(ids, greedy, lambda e: None, lora="beta")
    engine.loras.add("beta", setup[1]["beta"])  # loaded again: served again
    assert run(engine, [(ids, "beta")]) == reference(setup, [(ids, "beta")])


def test_bad_adapters_are_refused_naming_the_field(setup, tmp_path):
    base, folders, _ = setup
    engine = Engine(base, max_loras=1, max_lora_rank=4)
    with pytest.raises(InputError, match="lora_path: .* not a PEFT adapter folder"):
        engine.loras.add("x", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="lora_path: .*rank 8.*max_lora_rank 4"):
        engine.loras.add("x", folders["beta"])
    wider = tiny_model("llama", 320, dim=64)  # an adapter made for another model's widths
    make_adapter(wider, LoRAConfig(rank=2, targets=["wq"]), str(tmp_path / "wide"), seed=1)
    with pytest.raises(InputError, match="lora_path: .*layers.0.attention.wq.*do not fit"):
        engine.loras.add("x", str(tmp_path / "wide"))
    shutil.copytree(folders["alpha"], tmp_path / "dora")
    config_file = tmp_path / "dora" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "use_dora": True}))
    with pytest.raises(InputError, match="lora_path: .*unsupported LoRA options"):
        engine.loras.add("x", str(tmp_path / "dora"))
    engine.loras.add("alpha", folders["alpha"])
    with pytest.raises(InputError, match="lora_name: adapter 'alpha' is already loaded"):
        engine.loras.add("alpha", folders["alpha"])
    greedy = SamplingParams(max_new_tokens=1)
    with pytest.raises(UnknownAdapter, match="model: no LoRA adapter named 'nope'"):
        engine.submit([1, 2], greedy, lambda e: None, lora="nope")
    with pytest.raises(InputError, match="serves none"):
        Engine(base).submit([1, 2], greedy, lambda e: None, lora="alpha")


@pytest.mark.parametrize(
    "slot_of",
    [[2, None, 0, 1, 2], [2, 2, 0, 0, 1], [None, 1, 1, 0, 0], [2, None, 0, 1], [1, 1, 1, 1]],
    ids=["gathered with base rows", "adjacent", "adjacent with base", "bmm per row", "uniform"],
)
def test_lora_matmul_gives_each_row_its_own_adapter(slot_of):
    """add_lora over rows of 3 adapters and the base: each adapter row gets x A^T B^T of its
    own slot, base rows stay bit-identical."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 4, 8, generator=g), torch.randn(3, 6, 4, generator=g)
    x = torch.randn(len(slot_of), 2, 8, generator=g)
    out = torch.randn(len(slot_of), 2, 6, generator=g)
    got = add_lora(out.clone(), x, a, b, RowSlots.of(slot_of, torch.device("cpu")))
    for i, s in enumerate(slot_of):
        if s is None:
            assert torch.equal(got[i], out[i])
        else:
            torch.testing.assert_close(got[i], out[i] + x[i] @ a[s].T @ b[s].T)
    assert RowSlots.of([None, None], torch.device("cpu")) is None


def test_an_engine_without_adapter_rows_runs_the_base_forward(setup):
    """Adapters loaded but not asked for: the hooks add nothing (bit-identical logits)."""
    base = setup[0]
    model = copy.deepcopy(base.model)
    plain = model(torch.tensor([[1, 2, 3]]))
    engine = Engine(Generator(model, base.tokenizer), max_loras=2)
    engine.loras.add("alpha", setup[1]["alpha"])
    with engine.loras.slots.rows([None], torch.device("cpu")):
        assert torch.equal(model(torch.tensor([[1, 2, 3]])), plain)
    engine.loras.slots.close()


def test_adapters_run_over_an_int8_model(setup):
    """`--quantize int8` with adapters: the hooks act on the quantized layers (adapter rows
    change), base rows stay the int8 model's exactly, and adapter rows agree with the merged
    fp32 model as closely as int8 agrees with fp32 (most requests token for token)."""
    base, folders, refs = setup
    int8 = quantize_model(copy.deepcopy(base.model), "int8")
    engine = Engine(Generator(int8, base.tokenizer, eos_token_ids=[]), max_loras=1)
    engine.loras.add("alpha", folders["alpha"])
    jobs = [(ids, lora) for ids in prompts(6, seed=9) for lora in (None, "alpha")]
    got = run(engine, jobs)
    greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    plain = Generator(int8, base.tokenizer, eos_token_ids=[]).generate_ids(
        [ids for ids, _ in jobs[::2]], greedy
    )
    assert got[::2] == plain  # base rows: the int8 model's tokens
    assert all(g != p for g, p in zip(got[1::2], plain, strict=True))  # the adapter acts
    merged = reference(setup, jobs[1::2])
    assert sum(g == m for g, m in zip(got[1::2], merged, strict=True)) >= 3


def test_a_request_waiting_for_a_slot_lets_later_requests_pass(setup):
    """One slot held by alpha's running request: beta's request waits, keeping its place, and
    the base request queued behind it is admitted meanwhile (vLLM's scheduler skips it too)."""
    engine = lora_engine(setup, max_loras=1)
    ids = prompts(3, seed=11)
    long, short = (SamplingParams(max_new_tokens=n, temperature=0.0) for n in (NEW, 2))
    first = engine.submit(ids[0], long, lambda e: None, lora="alpha")
    waiting = engine.submit(ids[1], short, lambda e: None, lora="beta")
    behind = engine.submit(ids[2], short, lambda e: None)
    steps = engine.run([first, waiting, behind])
    next(steps)
    sched = engine.scheduler
    assert first in sched.running and behind in sched.running
    assert list(sched.waiting) == [waiting]
    for _ in steps:
        pass
    assert behind.seq.done and behind.seq.token_ids == reference(setup, [(ids[2], None)])[0][:2]
    assert waiting.seq.token_ids == reference(setup, [(ids[1], "beta")])[0][:2]
