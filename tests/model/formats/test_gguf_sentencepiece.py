"""GGUF export and import of sentencepiece-style tokenizers (llama.cpp's `tokenizer.ggml.model =
"llama"`): Llama 2, Mistral and Gemma 3 vocabularies on tiny random transformers models.

Each source tokenizer is built here as their Hub tokenizer.json files are: a BPE with byte
fallback and `<0xNN>` tokens, "▁" for spaces, and the complete merges transformers' converters
derive from a sentencepiece model (every split of a token, ranked by its score). The vocabulary
is trained on a few English and Japanese sentences; emoji and unseen kanji fall back to bytes.

- Llama 2 style: a Prepend("▁") + Replace normalizer (Llama 2's own file; sentencepiece's and
  llama.cpp's rule: a space before the text, even one that starts with a space).
- Mistral style: Metaspace(prepend_scheme="first") (newer files and transformers' LlamaTokenizer:
  no extra "▁" before text that already starts with one). A GGUF's `add_space_prefix` cannot say
  so: llama.cpp, and Kiln's import, prefix the space as Llama 2 does, so text starting with
  whitespace differs there; transformers' GGUF loader builds its LlamaTokenizer, which is this.
- Gemma 3 style: a Replace normalizer only (`add_space_prefix` false).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from kiln.model.formats.gguf_spm_tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
)
from kiln.model.formats.gguf_tokenizer import build_tokenizer, tokenizer_metadata
from kiln.model.formats.weights import import_model
from kiln.platform.errors import ConfigError
from kiln.serving.export.gguf import export_gguf
from kiln.text.tokenizer import load_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")

SPACE = "\u2581"
TRAIN = [
    "The kiln fires the clay at 1200 degrees.",
    "Hello world, hello kiln! The glaze melts and the pots cool slowly.",
    "窯は粘土を焼きます。釉薬が溶けて、器はゆっくり冷めます。",
]
EMOJI = "fire 🔥 and clay 🏺 ✨"
TEXTS = [
    "The kiln fires the clay.",
    "The color of kilo clay",  # merge order matters: llama.cpp left to right splits it otherwise
    "Hello, glaze world 1200!",
    "窯で粘土を焼く。陶磁器と茶碗",  # 陶磁器, 茶碗: unseen, bytes
    EMOJI,
    "kiln  two  spaces and a tab\there",
    "line one\nline two\n\n",
    "trailing spaces   ",
    "  leading spaces",
    " one leading space",
    "\nleading newline",
]
LEADING = {t for t in TEXTS if t[:1].isspace()}
TOOL = "<tool>"  # a user-defined (added, not special) token
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
    "<end_of_turn>\n{% endfor %}"
)
SPECIALS = {
    "llama2": ["<unk>", "<s>", "</s>"],
    "mistral": ["<unk>", "<s>", "</s>"],
    "gemma3": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
}
NAMES = {
    "llama2": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "gemma3": {
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    },
}
PADDING = {"llama2": 3, "mistral": 0, "gemma3": 0}  # unused ids past the tokenizer ([PADn])
GRID = 2.0**12  # Gemma's norms are stored as 1 + w: exact in float32 on this grid


def _sentencepiece_tokenizer(style: str):
    """A tokenizer.json as the Hub's files of `style` are (see the module doc)."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers.tokenization_utils_base import generate_merges

    prefix = style != "gemma3"
    trainer_tok = Tokenizer(models.BPE())
    scheme = "always" if prefix else "never"
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(SPACE, prepend_scheme=scheme, split=True)
    trainer = trainers.BpeTrainer(vocab_size=260, show_progress=False)
    trainer_tok.train_from_iterator(TRAIN * 20, trainer)
    trained = trainer_tok.get_vocab()
    pieces = sorted(trained, key=trained.get)  # the alphabet, then tokens in merge order
    specials = SPECIALS[style]
    names = [*specials, *(f"<0x{b:02X}>" for b in range(256)), *pieces, TOOL]
    vocab = {name: index for index, name in enumerate(names)}
    piece_vocab = {p: vocab[p] for p in pieces}
    merges = generate_merges(piece_vocab, {p: -vocab[p] for p in pieces})
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if style == "llama2":
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)]
        )
    elif style == "mistral":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(SPACE, prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    bos = NAMES[style]["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, vocab[bos])]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(TOOL, special=False, normalized=False)])
    return tok


def _hf_config(style: str, vocab_size: int):
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig

    common = {
        "vocab_size": vocab_size,
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
    if style == "llama2":
        return LlamaConfig(**common, tie_word_embeddings=False)
    if style == "mistral":
        return MistralConfig(**common, sliding_window=None, tie_word_embeddings=False)
    # transformers' GGUF loader takes Gemma 3's head width (256) from its own defaults; 6
    # layers: llama.cpp's pattern, 5 in a window of 4, 1 global
    gemma = {**common, "hidden_size": 32, "num_hidden_layers": 6, "num_attention_heads": 2}
    return Gemma3TextConfig(
        **{**gemma, "num_key_value_heads": 1, "bos_token_id": 2, "eos_token_id": 1},
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4,
    )


def _hf_folder(style: str, path: str):
    """(random transformers model, its tokenizers.Tokenizer), saved together in `path`."""
    from transformers import AutoModelForCausalLM

    tok = _sentencepiece_tokenizer(style)
    config = _hf_config(style, tok.get_vocab_size() + PADDING[style])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.round(torch.empty_like(p).uniform_(0.5, 1.5) * GRID) / GRID)
            else:
                p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    tok.save(os.path.join(path, "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", **NAMES[style]}
    tok_config["chat_template"] = CHAT_TEMPLATE
    if style == "gemma3":  # the others leave it to tokenizer.json's TemplateProcessing
        tok_config["add_bos_token"] = True
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)
    return model, tok


def _export(path: str, out: str) -> str:
    assert export_gguf(path, out, gguf_type="f32", name="tiny")["architecture"] in (
        "llama",
        "gemma3",
    )
    return out


@pytest.mark.parametrize("style", ["llama2", "mistral", "gemma3"])
def test_transformers_loads_the_file_with_the_source_ids_and_logits(style, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = str(tmp_path / "hf")
    source, tok = _hf_folder(style, hf)
    gguf = _export(hf, str(tmp_path / "gguf" / "m.gguf"))
    folder, name = os.path.split(gguf)
    theirs = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    reference = AutoTokenizer.from_pretrained(hf)
    # transformers builds a Metaspace("first") LlamaTokenizer from any llama-arch file: text
    # that starts with whitespace gets no extra "▁" there, as it does in Llama 2's own file
    texts = [t for t in TEXTS if style != "llama2" or t not in LEADING]
    for text in texts:
        ids = reference(text)["input_ids"]
        assert ids == tok.encode(text).ids
        assert theirs(text)["input_ids"] == ids, text
        assert theirs.decode(ids) == reference.decode(ids)
    assert tok.token_to_id("<0xF0>") in tok.encode(EMOJI).ids  # byte fallback

    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    encoded = [tok.encode(t).ids for t in texts[:4]]
    width = max(map(len, encoded))
    tokens = torch.tensor([ids + [0] * (width - len(ids)) for ids in encoded])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in encoded])
    with torch.no_grad():
        ours = loaded.eval()(tokens, attention_mask=mask).logits
        want = source(tokens, attention_mask=mask).logits
    torch.testing.assert_close(ours[mask.bool()], want[mask.bool()], rtol=0, atol=1e-4)


@pytest.mark.parametrize("style", ["llama2", "gemma3"])
def test_gguf_reader_sees_the_llama_vocabulary_fields(style, tmp_path):
    from gguf import GGUFReader, GGUFValueType

    hf = str(tmp_path / "hf")
    _, tok = _hf_folder(style, hf)
    reader = GGUFReader(_export(hf, str(tmp_path / "m.gguf")))

    def field(key, kind, item=None):
        f = reader.fields[key]
        assert f.types[0] == kind, key
        if item is not None:
            assert f.types[1] == item, key
        return f.contents()

    array = GGUFValueType.ARRAY
    assert field("tokenizer.ggml.model", GGUFValueType.STRING) == "llama"
    assert field("tokenizer.ggml.pre", GGUFValueType.STRING) == "default"
    tokens = field("tokenizer.ggml.tokens", array, GGUFValueType.STRING)
    scores = field("tokenizer.ggml.scores", array, GGUFValueType.FLOAT32)
    types = field("tokenizer.ggml.token_type", array, GGUFValueType.INT32)
    assert "tokenizer.ggml.merges" not in reader.fields  # llama.cpp merges by score
    n = tok.get_vocab_size()
    assert len(tokens) == len(scores) == len(types) == n + PADDING[style]
    vocab = tok.get_vocab()
    assert tokens[:n] == sorted(vocab, key=vocab.get)
    assert tokens[n:] == [f"[PAD{i}]" for i in range(n, n + PADDING[style])]
    kinds = {tokens[i]: k for i, k in enumerate(types)}
    assert kinds["<unk>"] == UNKNOWN and kinds["<0x0A>"] == BYTE and kinds[TOOL] == USER_DEFINED
    assert all(kinds[t] == CONTROL for t in SPECIALS[style] if t != "<unk>")
    assert all(kinds[t] == UNUSED for t in tokens[n:])
    assert sum(k == BYTE for k in types) == 256
    # normal tokens: ranked by the merge that makes them (here, as in sentencepiece, id order)
    normal = [i for i, k in enumerate(types) if k == NORMAL]
    made = [i for i in normal if len(tokens[i]) > 1]
    assert [scores[i] for i in made] == sorted((scores[i] for i in made), reverse=True)
    assert len({scores[i] for i in normal}) == len(normal) and max(scores[i] for i in normal) < 0
    names = NAMES[style]
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown")):
        index = field(f"tokenizer.ggml.{key}_token_id", GGUFValueType.UINT32)
        assert tokens[index] == names[f"{name}_token"]
    assert field("tokenizer.ggml.add_bos_token", GGUFValueType.BOOL) is True
    assert field("tokenizer.ggml.add_eos_token", GGUFValueType.BOOL) is False
    prefix = field("tokenizer.ggml.add_space_prefix", GGUFValueType.BOOL)
    assert prefix is (style == "llama2")
    assert field("tokenizer.chat_template", GGUFValueType.STRING) == CHAT_TEMPLATE


@pytest.mark.parametrize("style", ["llama2", "mistral", "gemma3"])
def test_kiln_import_tokenizes_as_the_source_and_re_exports_byte_identical(style, tmp_path):
    hf = str(tmp_path / "hf")
    _, tok = _hf_folder(style, hf)
    first = _export(hf, str(tmp_path / "first.gguf"))
    ckpt = str(tmp_path / "ckpt")
    import_model(first, ckpt)
    imported = load_tokenizer(ckpt)
    chat = f"<start_of_turn>user\nHi {TOOL} there<end_of_turn>\n"
    texts = [*TEXTS, f"call {TOOL} now", chat, "</s><unk>"]
    # llama.cpp (and so the import) puts the space before any text; Mistral-style Metaspace
    # ("first") only before text that does not start with one, and not after a special token
    if style == "mistral":
        texts = [t for t in texts if t not in LEADING and TOOL not in t]
    for text in texts:
        assert imported.encode(text).ids == tok.encode(text).ids, text
        assert imported.decode(tok.encode(text).ids) == tok.decode(tok.encode(text).ids)
    with open(os.path.join(ckpt, "tokenizer_config.json")) as f:
        config = json.load(f)
    assert config["chat_template"] == CHAT_TEMPLATE and config["add_bos_token"] is True
    assert {k: config[k] for k in NAMES[style]} == NAMES[style]
    second = _export(ckpt, str(tmp_path / "second.gguf"))
    from kiln.model.formats.gguf import read_header

    a, b = read_header(first)[0], read_header(second)[0]
    assert {k for k in a if a[k] != b.get(k)} == set()
    with open(first, "rb") as a, open(second, "rb") as b:
        assert a.read() == b.read()


def test_unsupported_tokenizer_kinds_are_a_config_error_naming_them():
    from tokenizers import Tokenizer, models

    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0))
    with pytest.raises(ConfigError, match="tokenizer model 'Unigram' is not supported"):
        tokenizer_metadata(unigram, {}, 3)
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    with pytest.raises(ConfigError, match="'WordPiece'"):
        tokenizer_metadata(wordpiece, {}, 2)
    plain_bpe = Tokenizer(models.BPE({"a": 0, "b": 1}, []))  # neither byte-level nor "▁"
    with pytest.raises(ConfigError, match="'BPE' \\(neither byte-level nor byte_fallback"):
        tokenizer_metadata(plain_bpe, {}, 2)
    with pytest.raises(ConfigError, match="tokenizer.ggml.model 't5'"):
        build_tokenizer({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]})


@pytest.mark.parametrize("style", ["llama2", "mistral", "gemma3"])
def test_llama_cpp_tokenization_of_the_file_is_the_sources(style, tmp_path):
    """llama.cpp's own algorithm (llama_cpp_spm, restated from llama-vocab.cpp) over the file's
    scores gives the source's ids; the scores llama.cpp's converter writes from a tokenizer.json
    alone (LlamaHfVocab: -1000 for every token) do not."""
    from kiln.model.formats.gguf import read_header

    from .llama_cpp_spm import tokenize

    hf = str(tmp_path / "hf")
    _, tok = _hf_folder(style, hf)
    meta = read_header(_export(hf, str(tmp_path / "m.gguf")))[0]
    texts = [*TEXTS, f"call {TOOL} now", f"<start_of_turn>user\nHi {TOOL}<end_of_turn>\n"]
    if style == "mistral":  # Metaspace "first": see the module doc
        texts = [t for t in texts if t not in LEADING and TOOL not in t]
    for text in texts:
        assert tokenize(meta, text) == tok.encode(text).ids, text
    flat = [
        -1000.0 if kind == NORMAL else score
        for score, kind in zip(
            meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"], strict=True
        )
    ]
    flat_meta = {**meta, "tokenizer.ggml.scores": flat}
    assert any(tokenize(flat_meta, text) != tok.encode(text).ids for text in texts)


def test_chat_template_jinja_is_carried_when_the_config_has_none(tmp_path):
    """Newer HF folders keep the template in chat_template.jinja (llama.cpp's converter reads
    it when tokenizer_config.json has none)."""
    from kiln.model.formats.gguf import read_header

    hf = str(tmp_path / "hf")
    _hf_folder("gemma3", hf)
    config_path = os.path.join(hf, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    template = config.pop("chat_template")
    with open(config_path, "w") as f:
        json.dump(config, f)
    assert "tokenizer.chat_template" not in read_header(_export(hf, str(tmp_path / "a.gguf")))[0]
    with open(os.path.join(hf, "chat_template.jinja"), "w") as f:
        f.write(template)
    meta = read_header(_export(hf, str(tmp_path / "b.gguf")))[0]
    assert meta["tokenizer.chat_template"] == CHAT_TEMPLATE


def test_import_merges_by_score_not_by_id():
    """llama.cpp joins the pair making the highest-scored token: "bc" (id 5) outranks "ab"."""
    tokens = ["<unk>", "▁", "a", "b", "c", "ab", "bc", *(f"<0x{b:02X}>" for b in range(256))]
    scores = [0.0, -9.0, -10.0, -11.0, -12.0, -2.0, -1.0, *([0.0] * 256)]
    types = [UNKNOWN, *([NORMAL] * 6), *([BYTE] * 256)]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": False,
    }
    tok = build_tokenizer(meta)
    assert tok.encode("abc").ids == [2, 6]
    assert tok.encode("abc d").ids == [2, 6, 1, tokens.index("<0x64>")]  # d: a byte
    tied = build_tokenizer({**meta, "tokenizer.ggml.scores": [-1.0] * len(tokens)})
    assert tied.encode("abc").ids == [5, 4]  # equal scores: the lower id first
