"""The rollout engine's column-major linear weights: a decode step of a few rows pads only to
the rows the probe measured (2 on MKL) instead of 16, and the engine's sampling log-probs stay
the trainer's bit for bit, before and after a refit, with a tied LM head and an untied one."""

import copy

import pytest
import torch

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model import ModelConfig, Transformer
from kiln.model.attention import set_attention_backend
from kiln.model.batch_invariance import MIN_GEMM_ROWS, column_major_exact_rows
from kiln.training.rl.logprobs import rollout_mismatch_max
from kiln.training.rl.refit import copy_into, refit, state_checksum
from kiln.training.rl.rollout import column_major_layout, generate_rollouts
from tests.engine.tiny import tiny_model, train_tokenizer


def _policy(vocab_size: int, tied: bool) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=vocab_size, dim=128, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden_dim=256,
        max_seq_len=160, tie_embeddings=tied,
    )  # fmt: skip
    policy = Transformer(cfg).train()
    set_attention_backend(policy, "invariant")
    return policy


def _is_column_major(weight: torch.Tensor) -> bool:
    return weight.stride() == (1, weight.shape[0])


@pytest.mark.parametrize("tied", [True, False])
def test_column_major_engine_samples_the_trainers_logprobs_exactly_with_few_rows(tied):
    tok = train_tokenizer()
    policy = _policy(tok.get_vocab_size(), tied)
    # eight end-of-text ids: completions of many lengths, so decode steps run 12 rows down to 1
    gen = Generator(copy.deepcopy(policy), tok, eos_token_ids=list(range(8)))
    rows, head_rows = column_major_layout(gen.model)
    if rows >= MIN_GEMM_ROWS:
        pytest.skip("this CPU's sgemm gives no smaller exact row count")
    engine = gen.model
    blocks = [m for m in engine.layers.modules() if type(m) is torch.nn.Linear]
    assert all(_is_column_major(m.weight) for m in blocks)
    if tied:  # the embedding's weight, row-major: the head keeps the 16-row padding
        assert engine.output.weight is engine.tok_embeddings.weight
        assert not _is_column_major(engine.output.weight) and head_rows == MIN_GEMM_ROWS
    else:
        assert _is_column_major(engine.output.weight) and head_rows < MIN_GEMM_ROWS
    assert not _is_column_major(policy.layers["0"].feed_forward.w1.weight)  # the trainer's

    prompts = [tok.encode("the quick brown fox").ids, tok.encode("hello world, this").ids[:3]]
    params = SamplingParams(max_new_tokens=64, temperature=1.0)
    for step in range(2):
        rollouts = generate_rollouts(gen, prompts, group_size=6, params=params, seed=11)
        lengths = sorted(len(r.completion_ids) for r in rollouts)
        assert lengths[-1] > lengths[-2] + 4 and len(set(lengths)) > 6  # 1-row steps
        assert rollout_mismatch_max(policy, rollouts) == 0.0, step
        opt = torch.optim.SGD(policy.parameters(), lr=0.05)
        logits = policy(torch.tensor([rollouts[0].prompt_ids + rollouts[0].completion_ids]))
        logits.logsumexp(-1).mean().backward()
        opt.step()
        refit(policy, gen.model)
        # the in-place refit keeps the layout and brings the engine level with the trainer
        assert _is_column_major(engine.layers["0"].feed_forward.w1.weight)
        assert _is_column_major(engine.output.weight) != tied
        assert state_checksum(engine.state_dict()) == state_checksum(policy.state_dict())


@pytest.mark.parametrize("shape", [(1536, 576), (576, 1536), (192, 576)])  # SmolLM2's linears
def test_the_probed_row_count_holds_for_other_numbers_and_batches(shape):
    """The probe measures one random weight; its answer holds for other weights and inputs
    against a row-major product over a larger batch (a trainer's)."""
    out_features, in_features = shape
    rows = column_major_exact_rows(out_features, in_features, torch.get_num_threads())
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(out_features, in_features, generator=g) * 0.05
    x = torch.randn(200, in_features, generator=g)
    reference = x @ weight.T
    column_major = weight.T.contiguous().T
    for m in range(rows, MIN_GEMM_ROWS + 1):
        assert torch.equal(torch.nn.functional.linear(x[:m], column_major), reference[:m]), m


def test_a_mixture_of_experts_keeps_the_padding_and_its_layout():
    """Experts multiply 3-D weights outside nn.Linear: the layout is left alone, 16 rows."""
    model = tiny_model("mixtral", 64)
    before = {name: p.stride() for name, p in model.named_parameters()}
    assert column_major_layout(model) == (MIN_GEMM_ROWS, MIN_GEMM_ROWS)
    assert {name: p.stride() for name, p in model.named_parameters()} == before


def test_a_refit_copy_into_a_column_major_weight_keeps_values_and_layout():
    """Copied a block of rows at a time (200 rows: three full blocks and a part one)."""
    src = torch.randn(200, 24)
    dst = torch.zeros(24, 200).T
    copy_into(dst, src)
    assert torch.equal(dst, src) and dst.stride() == (1, 200)
    row_major = torch.zeros(200, 24)
    copy_into(row_major, src)
    assert torch.equal(row_major, src)
