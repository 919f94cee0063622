"""The model alone: shapes, presets, HF Llama parity, attention core vs a naive reference."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.model import AttentionCore, ModelConfig, Transformer
from kiln.platform.errors import ConfigError


def naive_attention(q, k, v, window=None):
    """Textbook attention: expand kv heads, mask, softmax. The reference for every backend."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    S = q.shape[2]
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    allowed = (j <= i) & ((i - j) < window if window else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize(
    "hq,hkv,window", [(4, 4, None), (4, 2, None), (4, 1, None), (4, 2, 5), (4, 1, 3)]
)
def test_attention_core_matches_naive(hq, hkv, window):
    torch.manual_seed(0)
    q = torch.randn(2, hq, 17, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, hkv, 17, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, hkv, 17, 8, dtype=torch.float64, requires_grad=True)
    out = AttentionCore(8, window, "sdpa")(q, k, v)
    ref = naive_attention(q, k, v, window)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, r in zip(grads, ref_grads, strict=False):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


def test_presets_and_param_count():
    for name in ("tiny", "125m", "1b", "llama3_8b"):
        ModelConfig.preset(name)
    assert 7.9e9 < ModelConfig.preset("llama3_8b").num_params() < 8.1e9
    cfg = ModelConfig.preset("tiny", tie_embeddings=True)
    model = Transformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    assert model.output.weight is model.tok_embeddings.weight


def test_bad_configs_are_clear_errors():
    with pytest.raises(ConfigError, match="n_kv_heads"):
        ModelConfig(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError, match="preset"):
        ModelConfig.preset("nope")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="attention_backend"):
            Transformer(ModelConfig.preset("tiny", attention_backend="flash_attn"))


def _to_hf_name(name: str) -> str:
    for ours, theirs in [
        ("attention.wq", "self_attn.q_proj"),
        ("attention.wk", "self_attn.k_proj"),
        ("attention.wv", "self_attn.v_proj"),
        ("attention.wo", "self_attn.o_proj"),
        ("feed_forward.w1", "mlp.gate_proj"),
        ("feed_forward.w2", "mlp.down_proj"),
        ("feed_forward.w3", "mlp.up_proj"),
        ("attention_norm", "input_layernorm"),
        ("ffn_norm", "post_attention_layernorm"),
    ]:
        name = name.replace(ours, theirs)
    if name.startswith("layers."):
        return "model." + name
    return {
        "tok_embeddings.weight": "model.embed_tokens.weight",
        "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }[name]


@pytest.mark.parametrize("window", [None, 6])
def test_matches_hugging_face(window):
    """Same weights under HF names give the same logits: export needs no permutation."""
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig.preset("tiny", sliding_window=window)
    torch.manual_seed(0)
    model = Transformer(cfg)
    common = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": False,
    }
    if window is None:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        hf = transformers.MistralForCausalLM(
            transformers.MistralConfig(**common, sliding_window=window, head_dim=cfg.head_dim)
        )
        hf.config._attn_implementation = "eager"
    hf.load_state_dict({_to_hf_name(k): v for k, v in model.state_dict().items()})
    tokens = torch.randint(0, cfg.vocab_size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf.eval()(tokens).logits, atol=1e-5, rtol=1e-5)


def test_meta_init_and_stage_skips():
    cfg = ModelConfig.preset("tiny")
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device="cpu")
    model.init_weights(buffer_device=torch.device("cpu"))
    tokens = torch.randint(0, cfg.vocab_size, (1, 8))
    assert model(tokens).shape == (1, 8, cfg.vocab_size)
    model.tok_embeddings, model.output = None, None  # a middle pipeline stage takes hidden states
    assert model(torch.randn(1, 8, cfg.dim)).shape == (1, 8, cfg.dim)


@pytest.mark.slow  # a fresh interpreter importing torch
def test_loading_weights_builds_on_meta_without_torch_dynamo(tmp_path):
    """`build_model(cfg, state)` draws no weights and imports no torch._dynamo (~3.5 CPU s that
    a serving replica or a tritonserver model would pay at each start); it holds the state."""
    import subprocess
    import sys

    cfg = ModelConfig.preset("tiny")
    reference = Transformer(cfg)
    torch.save(reference.state_dict(), tmp_path / "state.pt")
    code = f"""
import sys, torch
from kiln.model import ModelConfig
from kiln.model.formats.weights import build_model
state = torch.load({str(tmp_path / "state.pt")!r}, weights_only=True)
model = build_model(ModelConfig.preset("tiny"), state, device="cpu")
assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
assert model.rope_cos.numel() > 0
print("DYNAMO", "torch._dynamo" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "DYNAMO False" in out.stdout
