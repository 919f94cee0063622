"""`prepare-chat` / `prepare-preference`: rows -> template -> token ids + loss masks -> packed
rows in a chat dataset (`chat_dataset`), with a report and a rejected-rows file.

The output directory holds `<split>.bin/.idx` + `<split>.loss_mask.bin/.idx` +
`<split>.chat.json` (kind, seq_len, template, counts, packing report), `tokenizer.json` and
`rejected.jsonl`. Counts are conserved: read == accepted + rejected.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kiln.platform.errors import InputError
from kiln.text.chat_template import ChatTemplate, add_chat_tokens
from kiln.text.indexed_dataset import token_dtype
from kiln.text.tokenizer import load_tokenizer
from kiln.training.post.chat_dataset import ChatDatasetWriter
from kiln.training.post.chat_encode import LossMask, encode_chat, encode_preference
from kiln.training.post.packing import pack
from kiln.training.post.records import (
    BadRow,
    RejectedRows,
    iter_rows,
    to_conversation,
    to_preference,
)


def _setup(tokenizer, template: str | ChatTemplate, add_tokens: bool, out_dir: str):
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    if isinstance(template, str):
        template = ChatTemplate.resolve(template)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    added = add_chat_tokens(tok, template) if add_tokens else []
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok, template, added


def held_out(n: int, fraction: float, seed: int = 0) -> np.ndarray:
    """Which of n rows go to the validation split: round(n * fraction) of them (at least one
    when fraction > 0, never all), chosen by a seeded permutation."""
    if fraction <= 0 or n < 2:
        return np.zeros(n, dtype=bool)
    k = min(max(1, round(n * fraction)), n - 1)
    mask = np.zeros(n, dtype=bool)
    mask[np.random.RandomState(seed).permutation(n)[:k]] = True
    return mask


def _truncate(ids: np.ndarray, mask: np.ndarray, seq_len: int):
    """At most seq_len + 1 tokens (a row's worth); BadRow when nothing trained remains."""
    truncated = len(ids) > seq_len + 1
    ids, mask = ids[: seq_len + 1], mask[: seq_len + 1]
    if not mask[1:].any():
        raise BadRow(f"no trained tokens within seq_len {seq_len}")
    return ids, mask, truncated


def prepare_chat(
    inputs: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    tokenizer,
    template: str | ChatTemplate = "chatml",
    seq_len: int,
    loss_mask: LossMask = "assistant",
    packing: bool = True,
    add_tokens: bool = False,
    split: str = "train",
    valid_fraction: float = 0.0,
) -> dict:
    """Chat / instruction rows into an SFT chat dataset (`valid_fraction` of the conversations
    held out as the `valid` split); returns the report of `split`."""
    out_dir = str(out_dir)
    tok, template, added = _setup(tokenizer, template, add_tokens, out_dir)
    rejected = RejectedRows(os.path.join(out_dir, "rejected.jsonl"))
    docs, truncated = [], 0
    for file, n, row in iter_rows(inputs):
        try:
            ids, mask = encode_chat(template, tok, to_conversation(row), loss_mask)
            ids, mask, cut = _truncate(ids, mask, seq_len)
        except BadRow as e:
            rejected.reject(file, n, str(e), row)
            continue
        rejected.accept()
        truncated += cut
        docs.append((ids, mask))
    rejected.close()
    if not docs:
        raise InputError(f"{inputs}: no usable rows ({rejected.counts.as_dict()})")
    valid = held_out(len(docs), valid_fraction)
    common = {
        "template": template,
        "loss_mask": loss_mask,
        "packing": packing,
        "seq_len": seq_len,
        "added": added,
        "counts": rejected.counts.as_dict(),
        "truncated": truncated,
        "dtype": token_dtype(tok.get_vocab_size()),
    }
    if valid.any():
        held = [d for d, v in zip(docs, valid, strict=True) if v]
        _write_sft(held, os.path.join(out_dir, "valid"), **common)
        docs = [d for d, v in zip(docs, valid, strict=True) if not v]
    meta = _write_sft(docs, os.path.join(out_dir, split), **common)
    meta["valid_rows"] = int(valid.sum())
    return meta


def _write_sft(
    docs, prefix, *, template, loss_mask, packing, seq_len, added, counts, truncated, dtype
) -> dict:
    """One split of an SFT chat dataset: pack the conversations, write rows and meta."""
    lengths = np.array([len(d[0]) for d in docs])
    rows, report = pack(lengths, seq_len)
    if not packing:
        rows = [[i] for i in range(len(docs))]
    writer = ChatDatasetWriter(prefix, dtype)
    for row in rows:
        writer.add_row([docs[i] for i in row])
    meta = {
        "kind": "sft",
        "seq_len": seq_len,
        "packed": packing,
        "loss_mask": loss_mask,
        "template": template.name,
        "end_of_turn": template.end_of_turn,
        "chat_template": template.source,
        "added_tokens": added,
        "rows": len(rows),
        "tokens": int(lengths.sum()),
        "trained_tokens": int(sum(int(m[1:].sum()) for _, m in docs)),
        "truncated": truncated,
        "counts": counts,
        "packing": report.as_dict(),
    }
    writer.finalize(meta)
    return meta


def prepare_preference(
    inputs: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    tokenizer,
    template: str | ChatTemplate = "chatml",
    seq_len: int,
    add_tokens: bool = False,
    split: str = "train",
    valid_fraction: float = 0.0,
) -> dict:
    """Preference rows into a preference chat dataset (one row per pair; `valid_fraction` of the
    pairs held out as the `valid` split); returns the report of `split`."""
    out_dir = str(out_dir)
    tok, template, added = _setup(tokenizer, template, add_tokens, out_dir)
    rejected = RejectedRows(os.path.join(out_dir, "rejected.jsonl"))
    kept: list[list[tuple[np.ndarray, np.ndarray]]] = []
    truncated = 0
    for file, n, row in iter_rows(inputs):
        try:
            (c_ids, c_mask), (r_ids, r_mask) = encode_preference(template, tok, to_preference(row))
            c_ids, c_mask, c_cut = _truncate(c_ids, c_mask, seq_len)
            r_ids, r_mask, r_cut = _truncate(r_ids, r_mask, seq_len)
        except BadRow as e:
            rejected.reject(file, n, str(e), row)
            continue
        rejected.accept()
        truncated += c_cut or r_cut
        kept.append([(c_ids, c_mask), (r_ids, r_mask)])
    rejected.close()
    if not kept:
        raise InputError(f"{inputs}: no usable preference rows ({rejected.counts.as_dict()})")
    valid = held_out(len(kept), valid_fraction)
    meta = {}
    for name, rows in (
        (split, [p for p, v in zip(kept, valid, strict=True) if not v]),
        ("valid", [p for p, v in zip(kept, valid, strict=True) if v]),
    ):
        if not rows:
            continue
        writer = ChatDatasetWriter(os.path.join(out_dir, name), token_dtype(tok.get_vocab_size()))
        for pair in rows:
            writer.add_row(pair)
        split_meta = {
            "kind": "preference",
            "seq_len": seq_len,
            "template": template.name,
            "end_of_turn": template.end_of_turn,
            "chat_template": template.source,
            "added_tokens": added,
            "rows": len(rows),
            "truncated": truncated,
            "counts": rejected.counts.as_dict(),
        }
        writer.finalize(split_meta)
        meta = meta or split_meta
    return {**meta, "valid_rows": int(valid.sum())}
