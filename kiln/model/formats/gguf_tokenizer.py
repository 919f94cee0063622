"""A GGUF file's tokenizer as `tokenizer.json` + `tokenizer_config.json`.

A GGUF carries the vocabulary, merges, token types, special-token ids and chat template as
llama.cpp metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`). Byte-level BPE vocabularies
(`tokenizer.ggml.model = gpt2`: GPT-2, SmolLM, Llama 3, Qwen2) are rebuilt with the `tokenizers`
library: the split regex named by `tokenizer.ggml.pre`, byte-level BPE over the file's merges,
control tokens as special tokens. Sentencepiece vocabularies (`tokenizer.ggml.model = llama`:
Llama 2, Mistral, Gemma) are gguf_spm_tokenizer.py's; any other kind is a ConfigError naming it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kiln.model.formats.gguf_spm_tokenizer import (
    build_sentencepiece_tokenizer,
    is_sentencepiece,
    sentencepiece_vocab,
    space_prefix,
)
from kiln.platform.errors import ConfigError

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the split regex its merges were learned with (absent: GPT-2's own)
_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def build_tokenizer(meta: dict[str, Any]):
    """A `tokenizers.Tokenizer` equal to the one llama.cpp (and transformers) read from `meta`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":
        return build_sentencepiece_tokenizer(meta)
    if kind != "gpt2":
        raise ConfigError(
            f"GGUF tokenizer.ggml.model {kind!r}: only byte-level BPE ('gpt2') and "
            "sentencepiece BPE ('llama') are supported"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {token: index for index, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    split = _SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    control = [t for t, k in zip(tokens, types, strict=True) if k == _CONTROL]
    user = [t for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return tok


def tokenizer_config(meta: dict[str, Any]) -> dict[str, Any]:
    """`tokenizer_config.json`: special tokens by name, BOS/EOS policy and the chat template."""
    tokens = meta["tokenizer.ggml.tokens"]
    # llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise
    bos_default = meta.get("tokenizer.ggml.model") == "llama"
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", bos_default)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
    }
    for name, key in _SPECIAL_IDS.items():
        if meta.get(key) is not None:
            config[name] = tokens[int(meta[key])]
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


def write_tokenizer_files(meta: dict[str, Any], out_dir: str) -> None:
    """`tokenizer.json` (loads with `tokenizers` and AutoTokenizer) and `tokenizer_config.json`."""
    os.makedirs(out_dir, exist_ok=True)
    build_tokenizer(meta).save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(meta), f, indent=2, ensure_ascii=False)


_NORMAL, _UNUSED = 1, 5
_PRE_NAMES = {_LLAMA3_SPLIT: "llama-bpe", _QWEN2_SPLIT: "qwen2"}


def _split_regex(pre_tokenizer: dict | None) -> str | None:
    """The Split regex of a tokenizer.json pre-tokenizer (alone or first of a Sequence)."""
    if not pre_tokenizer:
        return None
    if pre_tokenizer.get("type") == "Sequence":
        steps = pre_tokenizer.get("pretokenizers") or []
        return _split_regex(steps[0]) if steps else None
    if pre_tokenizer.get("type") == "Split":
        return (pre_tokenizer.get("pattern") or {}).get("Regex")
    return None


def _token_name(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _adds(tok_config: dict[str, Any], spec: dict[str, Any], name: str) -> bool:
    """`add_bos_token` / `add_eos_token`: tokenizer_config.json's, else what the tokenizer.json's
    TemplateProcessing puts first / last (as llama.cpp's converter reads it)."""
    if isinstance(tok_config.get(f"add_{name}_token"), bool):
        return tok_config[f"add_{name}_token"]
    token = _token_name(tok_config.get(f"{name}_token"))
    post = spec.get("post_processor") or {}
    for step in post.get("processors") or [post]:
        if step.get("type") == "TemplateProcessing" and len(step.get("single") or []) > 1:
            end = step["single"][0 if name == "bos" else -1]
            return token is not None and (end.get("SpecialToken") or {}).get("id") == token
    return False


def _byte_level_vocab(spec: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """tokens, types, merges and the split regex's name of a byte-level BPE tokenizer.json."""
    model = spec["model"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [_UNUSED] * vocab_size
    for token, index in model["vocab"].items():
        if index < vocab_size:
            tokens[index], types[index] = token, _NORMAL
    for added in spec.get("added_tokens") or []:
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = _CONTROL if added.get("special") else _USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    regex = _split_regex(spec.get("pre_tokenizer"))
    pre = _PRE_NAMES.get(regex) if regex else "gpt2"
    if pre is None:
        raise ConfigError("GGUF export: the tokenizer's split regex has no llama.cpp pre-tokenizer")
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }


def _sentencepiece_vocab(spec: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """tokens, scores, types and the space prefix of a sentencepiece-style tokenizer.json."""
    tokens, scores, types = sentencepiece_vocab(spec, vocab_size)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": space_prefix(spec),
    }


def tokenizer_metadata(tok, tok_config: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The `tokenizer.*` GGUF metadata of a `tokenizers.Tokenizer` (the inverse of
    `build_tokenizer`): byte-level BPE as llama.cpp's `gpt2` vocabulary, sentencepiece-style BPE
    (byte fallback, "▁" spaces) as its `llama` one; padded to the model's `vocab_size` with
    unused tokens as llama.cpp's converter does; special tokens and the chat template come from
    `tok_config` (tokenizer_config.json)."""
    spec = json.loads(tok.to_str())
    model = spec.get("model") or {}
    if is_sentencepiece(spec):
        meta = _sentencepiece_vocab(spec, vocab_size)
    elif model.get("type") == "BPE" and (spec.get("decoder") or {}).get("type") == "ByteLevel":
        meta = _byte_level_vocab(spec, vocab_size)
    else:
        kind = repr(model.get("type"))
        if model.get("type") == "BPE":
            kind += " (neither byte-level nor byte_fallback with \u2581 for spaces)"
        raise ConfigError(
            f"GGUF export: tokenizer model {kind} is not supported; byte-level BPE and "
            "sentencepiece-style BPE are"
        )
    meta["tokenizer.ggml.add_bos_token"] = _adds(tok_config, spec, "bos")
    meta["tokenizer.ggml.add_eos_token"] = _adds(tok_config, spec, "eos")
    for name, key in _SPECIAL_IDS.items():
        token = _token_name(tok_config.get(name))
        index = tok.token_to_id(token) if token else None
        if index is not None and index < vocab_size:
            meta[key] = index
    if tok_config.get("chat_template"):
        meta["tokenizer.chat_template"] = tok_config["chat_template"]
    return meta
