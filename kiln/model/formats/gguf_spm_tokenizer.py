"""SentencePiece-style tokenizers in a GGUF: llama.cpp's `tokenizer.ggml.model = "llama"` vocab.

Llama 2, Mistral and Gemma ship a sentencepiece BPE model. Its `tokenizer.json` form is a BPE
with `byte_fallback`, `<0xNN>` byte tokens and `▁` for a space: a Replace(" ", "▁") normalizer,
or a Metaspace pre-tokenizer, with a "▁" put before the text where the model wants a space
prefix (Llama 2, Mistral: a Prepend normalizer or Metaspace's prepend scheme; Gemma: none).

llama.cpp keeps no merges for such a vocabulary: like sentencepiece, it repeatedly joins the
adjacent pair whose concatenation is the vocabulary token of highest score. So:

- export (`sentencepiece_vocab`): a token's score is its rank in the order the BPE's merges first
  make it (-1, -2, ...); tokens no merge makes follow, in id order (those that split into two
  vocabulary tokens first, so that an import and a second export give the same ranks). Byte,
  control and unknown tokens score 0, as in a sentencepiece model; user-defined and unused ones
  -1000, as llama.cpp's converter writes them. Given only a tokenizer.json, llama.cpp's own
  converter (gguf-py's LlamaHfVocab) scores every token -1000, which leaves llama.cpp merging
  left to right instead of in the BPE's order; ranks keep the BPE's order.
- import (`build_sentencepiece_tokenizer`): the merges come back from the scores, each normal
  token split every way into two vocabulary tokens, by falling score, ties by id (transformers'
  GGUF loader derives the same, ranking a Gemma file's by position alone), with the normalizer,
  decoder and BOS/EOS the metadata describes.
"""

from __future__ import annotations

import re
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from kiln.platform.errors import ConfigError

SPACE = "\u2581"  # sentencepiece's "▁"
# llama.cpp token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_ADDED_SCORE = -1000.0  # llama.cpp's converter: user-defined and padding tokens


def _steps(component: dict | None) -> list[dict]:
    """A tokenizer.json normalizer / pre-tokenizer / decoder as its list of steps."""
    if not component:
        return []
    if component.get("type") == "Sequence":
        inner = component.get("normalizers") or component.get("pretokenizers")
        return [s for step in inner or component.get("decoders") or [] for s in _steps(step)]
    return [component]


def _replaces_spaces(step: dict) -> bool:
    pattern = (step.get("pattern") or {}).get("String")
    return step.get("type") == "Replace" and pattern == " " and step.get("content") == SPACE


def is_sentencepiece(spec: dict[str, Any]) -> bool:
    """A tokenizer.json (parsed) that is a sentencepiece BPE: byte fallback and "▁" spaces."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        return False
    normalizer = _steps(spec.get("normalizer"))
    pre = _steps(spec.get("pre_tokenizer"))
    return any(_replaces_spaces(s) for s in normalizer) or any(
        s.get("type") == "Metaspace" for s in pre
    )


def space_prefix(spec: dict[str, Any]) -> bool:
    """Whether the tokenizer puts a "▁" before the text (llama.cpp's `add_space_prefix`)."""
    for step in _steps(spec.get("normalizer")):
        if step.get("type") == "Prepend" and step.get("prepend") == SPACE:
            return True
    for step in _steps(spec.get("pre_tokenizer")):
        if step.get("type") == "Metaspace":
            scheme = step.get("prepend_scheme")
            return scheme in ("always", "first") if scheme else bool(step.get("add_prefix_space"))
    return False


def _merge_order(vocab: dict[str, int], merges: list, normal: set[int]) -> list[int]:
    """Normal token ids by the first merge that makes each, then the others (see module doc)."""
    order: list[int] = []
    seen: set[int] = set()
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        index = vocab.get(left + right)
        if index in normal and index not in seen:
            seen.add(index)
            order.append(index)
    names = {index: token for token, index in vocab.items()}
    rest = sorted(normal - seen)
    splittable = [i for i in rest if _splits(names[i], vocab)]
    return order + splittable + [i for i in rest if not _splits(names[i], vocab)]


def _splits(token: str, vocab) -> list[tuple[str, str]]:
    """Every way `token` is two tokens of `vocab` (shortest left part first)."""
    return [
        (token[:k], token[k:])
        for k in range(1, len(token))
        if token[:k] in vocab and token[k:] in vocab
    ]


def sentencepiece_vocab(
    spec: dict[str, Any], vocab_size: int
) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a sentencepiece-style tokenizer.json, `vocab_size` long:
    ids the tokenizer does not use are `[PADn]`, unused, as llama.cpp's converter pads."""
    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [_ADDED_SCORE] * vocab_size
    types = [UNUSED] * vocab_size
    unk = model.get("unk_token")
    for token, index in vocab.items():
        if index >= vocab_size:
            continue
        tokens[index] = token
        if _BYTE_TOKEN.fullmatch(token) or token == unk:
            types[index], scores[index] = (BYTE if token != unk else UNKNOWN), 0.0
        else:
            types[index] = NORMAL
    for added in spec.get("added_tokens") or []:
        index = added["id"]
        if index >= vocab_size:
            continue
        if added["content"] == unk:
            tokens[index], types[index], scores[index] = unk, UNKNOWN, 0.0
        elif added.get("special"):
            tokens[index], types[index], scores[index] = added["content"], CONTROL, 0.0
        else:  # llama.cpp matches user-defined tokens in the raw text, spaces as spaces
            tokens[index] = added["content"].replace(SPACE, " ")
            types[index], scores[index] = USER_DEFINED, _ADDED_SCORE
    normal = {i for i, kind in enumerate(types) if kind == NORMAL}
    for rank, index in enumerate(_merge_order(vocab, model.get("merges") or [], normal)):
        scores[index] = -float(rank + 1)
    return tokens, scores, types


def _merges(tokens: list[str], scores: list[float], types: list[int], vocab) -> list:
    """Each normal token's splits into two vocabulary tokens, highest score first."""
    products = sorted(
        (i for i, kind in enumerate(types) if kind == NORMAL and len(tokens[i]) > 1),
        key=lambda i: (-scores[i], i),
    )
    return [pair for i in products for pair in _splits(tokens[i], vocab)]


def _post_processor(meta: dict[str, Any], tokens: list[str]):
    """BOS / EOS around every encoding, as `tokenizer.ggml.add_bos_token` (llama.cpp: on unless
    the file says otherwise for this vocabulary) and `add_eos_token` ask."""
    ends = []
    for flag, key, default in (
        ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id", True),
        ("tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id", False),
    ):
        index = meta.get(key)
        ends.append(tokens[index] if meta.get(flag, default) and index is not None else None)
    bos, eos = ends
    if bos is None and eos is None:
        return None
    head, tail = ([bos] if bos else []), ([eos] if eos else [])
    ids = {meta["tokenizer.ggml.bos_token_id"]} if bos else set()
    ids |= {meta["tokenizer.ggml.eos_token_id"]} if eos else set()
    return processors.TemplateProcessing(
        single=[*head, "$A", *tail],
        pair=[*head, "$A", *tail, *head, "$B:1", *tail],
        special_tokens=[(tokens[i], i) for i in sorted(ids)],
    )


def build_sentencepiece_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """The `tokenizers.Tokenizer` a `llama` GGUF vocabulary describes (see module doc)."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    scores = meta.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))]
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if not len(tokens) == len(scores) == len(types):
        raise ConfigError("GGUF tokenizer.ggml.scores / token_type: not one per token")
    vocab: dict[str, int] = {}
    for index, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind != UNUSED:
            vocab.setdefault(token, index)
    unk = next((t for t, kind in zip(tokens, types, strict=True) if kind == UNKNOWN), None)
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_merges(tokens, scores, types, vocab),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))  # llama.cpp's default
    spaces = normalizers.Replace(" ", SPACE)
    prepend = normalizers.Prepend(SPACE)
    tok.normalizer = normalizers.Sequence([prepend, spaces]) if prefix else spaces
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    special = [t for t, kind in zip(tokens, types, strict=True) if kind in (CONTROL, UNKNOWN)]
    user = [t for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    if (post := _post_processor(meta, tokens)) is not None:
        tok.post_processor = post
    return tok
