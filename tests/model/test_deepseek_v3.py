"""DeepSeek-V3 (MLA, YaRN, sigmoid grouped router, shared experts, dense first layers) from a
Hugging Face folder made here with `transformers`: kiln's logits equal transformers' on a padded
batch of mixed-length prompts, greedy decoding through the engine's KV cache (which holds the
latent only) equals `generate`, and HF -> kiln -> HF gives back the same bytes and config."""

from __future__ import annotations

import pytest
import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.hf import read_hf_dir
from kiln.model.formats.weights import build_model
from kiln.model.kv_cache import KVCache
from kiln.model.mla_config import MLAConfig
from kiln.model.paged_kv_cache import PagedKVCache
from kiln.model.transformer import Transformer
from tests.model.hf_parity import (
    assert_greedy_matches_generate,
    assert_hf_round_trip,
    assert_logits_match,
)

VOCAB = 96
LENGTHS = [11, 5, 8]
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 8,  # short, so the prompts reach the ramp
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,  # != mscale: the cos/sin factor and the softmax mscale both act
}
FIELDS = [
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_parameters",
    "rope_interleave",
    "tie_word_embeddings",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "norm_topk_prob",
    "first_k_dense_replace",
]


def _hf_config(q_lora_rank: int | None = 24, rope_interleave: bool = True):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        routed_scaling_factor=2.5,
        kv_lora_rank=16,
        q_lora_rank=q_lora_rank,
        qk_rope_head_dim=8,
        v_head_dim=12,
        qk_nope_head_dim=16,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        max_position_embeddings=128,
        rope_parameters=YARN,
        rope_interleave=rope_interleave,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )


def _random_hf(path: str, **kwargs):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_hf_config(**kwargs), attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a real bias changes the choice
                b.uniform_(-0.3, 0.3)
    model.eval().save_pretrained(path)
    return model


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]


def test_deepseek_v3_matches_transformers(tmp_path):
    hf_dir = str(tmp_path / "hf")
    hf = _random_hf(hf_dir)
    _, cfg, state = read_hf_dir(hf_dir)
    assert cfg.mla is not None and cfg.first_dense_layers == 1 and cfg.n_shared_experts == 1
    assert cfg.mtp_depth == 0  # config.json announces DeepSeek's MTP layer; transformers saves none
    model = build_model(cfg, state, device="cpu").eval()
    prompts = _prompts()
    assert_logits_match(model, hf, prompts)

    # greedy decoding through the engine's KV cache, which holds the latent
    assert_greedy_matches_generate(model, hf, prompts)
    assert_hf_round_trip(cfg, state, hf_dir, str(tmp_path / "back"), FIELDS)


@pytest.mark.parametrize(
    "kwargs", [{"q_lora_rank": None}, {"rope_interleave": False}], ids=["full-q", "halves"]
)
def test_deepseek_v3_variants_match_transformers(kwargs, tmp_path):
    """A full q projection (q_lora_rank null, DeepSeek-V2-Lite) and RoPE in halves."""
    hf_dir = str(tmp_path / "hf")
    hf = _random_hf(hf_dir, **kwargs)
    _, cfg, state = read_hf_dir(hf_dir)
    assert_logits_match(build_model(cfg, state, device="cpu").eval(), hf, _prompts())


MLA = MLAConfig(
    kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12
)


def test_mla_cache_holds_the_latent_only(capsys):
    """Per token and layer MLA caches kv_lora_rank + qk_rope_head_dim numbers; full attention of
    the same width caches 2 * n_heads * head_dim."""
    cfg = ModelConfig.preset("tiny", mla=MLA, n_heads=4)
    mla = KVCache.for_model(cfg, batch=1, max_len=8)
    per_token = cfg.n_layers * (MLA.kv_lora_rank + MLA.qk_rope_head_dim) * 4  # fp32
    assert mla.bytes_per_token() == per_token == 4 * 24 * 4
    assert mla.k[0].shape == (1, 1, 8, 16) and mla.v[0].shape == (1, 1, 8, 8)
    full_cfg = ModelConfig.preset("tiny", n_heads=4, n_kv_heads=4, head_dim=MLA.qk_head_dim)
    full = KVCache.for_model(full_cfg, batch=1, max_len=8).bytes_per_token()
    assert full == cfg.n_layers * 2 * 4 * MLA.qk_head_dim * 4
    # the engine's paged cache holds the same numbers per token, in blocks of 16
    paged = PagedKVCache.for_model(cfg, num_blocks=2, block_size=16)
    assert paged.k[0].shape == (2, 16, 1, 16) and paged.v[0].shape == (2, 16, 1, 8)
    assert PagedKVCache.bytes_per_block(cfg, 16, torch.float32) == 16 * per_token
    print(f"KV cache bytes/token: MLA {per_token}, full attention {full}")
    assert "MLA 384" in capsys.readouterr().out


def test_plan_counts_mla_and_shared_experts():
    """`kiln plan` and the FLOP count read `num_params`: MLA's projections, latent norms,
    shared experts and the dense first layer are all counted."""
    cfg = ModelConfig.preset(
        "tiny",
        mla=MLA,
        n_experts=4,
        top_k=2,
        moe_hidden_dim=32,
        n_shared_experts=2,
        first_dense_layers=1,
        router_score="sigmoid",
        n_expert_groups=2,
        topk_groups=1,
    )
    model = Transformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    assert not model.layers["0"].moe_enabled and model.layers["1"].moe_enabled
    assert model.layers["1"].shared_experts.w1.weight.shape == (64, cfg.dim)


def test_deepseek_v3_preset_counts_671b_parameters_37b_active():
    """The full DeepSeek-V3 shape, counted from the config alone (as `kiln plan` does):
    671B parameters, 37B of them active per token beside the embedding lookup (the published
    figures), and 576 cached numbers per token and layer."""
    cfg = ModelConfig.preset("deepseek_v3")
    assert round(cfg.num_params() / 1e9) == 671
    routed_off = sum(cfg.ffn_params(i) - cfg.ffn_params(i, active=True) for i in range(61))
    assert round((cfg.num_params(exclude_embedding=True) - routed_off) / 1e9) == 37
    mla = KVCache.for_model(cfg.model_copy(update={"n_layers": 1}), batch=1, max_len=1)
    assert mla.bytes_per_token() == (512 + 64) * 4  # one layer, fp32
