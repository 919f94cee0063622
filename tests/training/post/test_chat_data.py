"""Chat/instruction/preference rows -> indexed tokens + loss masks -> packed loader batches."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.text.chat_template import ChatTemplate
from kiln.training.data.loader import TokenLoader
from kiln.training.post.chat_dataset import IGNORE_INDEX, ChatDataset, ChatSource
from kiln.training.post.chat_encode import encode_chat
from kiln.training.post.packing import first_fit_decreasing, pack
from kiln.training.post.prepare import prepare_chat, prepare_preference
from tests.training.post.helpers import CONVERSATION, chat_tokenizer

GOOD_ROWS = [
    {"messages": CONVERSATION},
    {"prompt": "What is the capital of France?", "response": "Paris."},
    {"input": "the quick brown fox", "output": "jumps over the lazy dog", "system": "Be brief."},
    {"messages": CONVERSATION[1:3]},
]
BAD_ROWS = [
    ({"messages": [{"role": "user", "content": "hi"}]}, "last turn"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    ({"prompt": "hi"}, "expected"),
    ({"prompt": "", "response": "x"}, "non-empty"),
    ({"messages": [CONVERSATION[2], CONVERSATION[1]]}, "expected 'user'"),
]


def _write_jsonl(path, rows, broken_lines=0):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for _ in range(broken_lines):
            f.write("{not json\n")
    return str(path)


def test_rows_are_accepted_or_rejected_with_a_reason_and_counts_are_conserved(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    _write_jsonl(src / "a.jsonl", GOOD_ROWS[:2] + [r for r, _ in BAD_ROWS], broken_lines=1)
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "response": "b"}] * 3), src / "b.parquet")
    meta = prepare_chat(src, tmp_path / "out", tokenizer=chat_tokenizer(), seq_len=64)
    counts = meta["counts"]
    assert counts == {**counts, "read": 11, "accepted": 5, "rejected": 6}
    rejected = [
        json.loads(x) for x in (tmp_path / "out" / "rejected.jsonl").read_text().split("\n") if x
    ]
    assert len(rejected) == 6
    for (row, why), rec in zip(BAD_ROWS, rejected, strict=False):
        assert rec["data"] == row and why in rec["reason"], rec
    assert "invalid JSON" in rejected[-1]["reason"]
    ds = ChatDataset(tmp_path / "out" / "train")
    assert ds.tokens.num_tokens == meta["tokens"] and len(ds) == meta["rows"]


def test_first_fit_decreasing_matches_the_textbook_definition():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 60, 300)
    bins = first_fit_decreasing(sizes, 64)
    reference: list[list[int]] = []  # O(n * bins) first fit over decreasing sizes
    for i in np.argsort(-sizes, kind="stable"):
        for b in reference:
            if sum(sizes[j] for j in b) + sizes[i] <= 64:
                b.append(int(i))
                break
        else:
            reference.append([int(i)])
    assert bins == reference
    assert sorted(i for b in bins for i in b) == list(range(300))
    assert all(sizes[b].sum() <= 64 for b in bins)


def test_packing_report_and_rows(tmp_path):
    tok = chat_tokenizer()
    rows = [
        {"prompt": f"question {i} " * (1 + i % 5), "response": "answer " * (1 + i % 3)}
        for i in range(40)
    ]
    path = _write_jsonl(tmp_path / "chat.jsonl", rows)
    packed = prepare_chat(path, tmp_path / "packed", tokenizer=tok, seq_len=128)
    plain = prepare_chat(path, tmp_path / "plain", tokenizer=tok, seq_len=128, packing=False)
    report = packed["packing"]
    assert report["padding_packed"] < 0.2 * report["padding_unpacked"]  # >= 80% removed
    assert plain["rows"] == 40 and packed["rows"] == report["rows_packed"] < 40
    # every conversation is stored exactly once, whichever way it was grouped
    a, b = ChatDataset(tmp_path / "packed" / "train"), ChatDataset(tmp_path / "plain" / "train")
    key = lambda ds: sorted(tuple(ds.tokens[i].tolist()) for i in range(len(ds.tokens)))  # noqa: E731
    assert key(a) == key(b)


def test_loader_batches_mask_prompts_restart_positions_and_resume(tmp_path):
    tok = chat_tokenizer()
    template = ChatTemplate.builtin("chatml")
    rows = [{"messages": CONVERSATION}] + [
        {"prompt": f"q{i} the quick brown fox", "response": f"a{i} paris"} for i in range(30)
    ]
    prepare_chat(
        _write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "d", tokenizer=tok, seq_len=96
    )
    source = ChatSource(tmp_path / "d" / "train", seed=3)
    loader = TokenLoader(source, seq_len=96, micro_batch_size=2, prefetch=0)
    tokens, labels, positions, docs = next(loader)
    assert tokens.shape == labels.shape == positions.shape == docs.shape == (2, 96)
    # labels are the next token where it is trained on; positions restart per conversation
    for r in range(2):
        for d in range(int(docs[r].max()) + 1):
            sel = (docs[r] == d).numpy()
            assert positions[r][sel].tolist() == list(range(int(sel.sum())))
    # the multi-turn conversation: its trained labels are exactly its assistant tokens
    ids, mask = encode_chat(template, tok, CONVERSATION)
    ds = source.dataset
    row = next(r for r in range(len(ds)) if any(len(s[0]) == len(ids) for s in ds.sequences(r)))
    t, lab, _, doc = (a[0] for a in ds.gather_rows(np.array([row])))
    k = next(i for i, s in enumerate(ds.sequences(row)) if len(s[0]) == len(ids))
    sel = doc == k
    assert t[sel].tolist() == ids[:-1].tolist()
    assert lab[sel].tolist() == np.where(mask[1:] > 0, ids[1:], IGNORE_INDEX).tolist()
    # resume: the state is samples consumed; a new loader continues where the old one stopped
    for _ in range(3):
        next(loader)
    state = loader.state_dict()
    want = next(loader)
    resumed = TokenLoader(source, seq_len=96, micro_batch_size=2, prefetch=0)
    resumed.load_state_dict(state)
    got = next(resumed)
    assert all((x == y).all() for x, y in zip(want, got, strict=True))
    # data parallel: two ranks with micro-batch 1 together see the single rank's batch
    halves = [
        next(TokenLoader(source, seq_len=96, micro_batch_size=1, dp_rank=r, dp_size=2, prefetch=0))
        for r in range(2)
    ]
    first = next(TokenLoader(source, seq_len=96, micro_batch_size=2, prefetch=0))
    for i in range(4):
        assert (np.concatenate([h[i] for h in halves]) == first[i].numpy()).all()


def test_preference_rows_become_chosen_then_rejected_rows(tmp_path):
    tok = chat_tokenizer()
    rows = [
        {"prompt": "What is the capital of France?", "chosen": "Paris.", "rejected": "Tokyo."},
        {
            "messages": CONVERSATION[:4],
            "chosen": [{"role": "assistant", "content": "東京は日本の首都です。"}],
            "rejected": "quick brown fox",
        },
        {"prompt": "x", "chosen": "same", "rejected": "same"},
        {"chosen": "a", "rejected": "b"},
    ]
    meta = prepare_preference(
        _write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "p", tokenizer=tok, seq_len=80
    )
    assert meta["counts"]["read"] == 4 and meta["counts"]["accepted"] == 2 and meta["rows"] == 2
    tokens, labels, _, _ = ChatDataset(tmp_path / "p" / "train").gather_rows(np.array([0, 1]))
    assert tokens.shape == (4, 80)
    chosen = tok.decode(labels[0][labels[0] >= 0].tolist(), skip_special_tokens=False)
    rejected = tok.decode(labels[2][labels[2] >= 0].tolist(), skip_special_tokens=False)
    assert (chosen, rejected) == ("Paris.<|im_end|>", "Tokyo.<|im_end|>")
    # the prompt is identical context in both rows
    n = int(np.argmax(labels[0] >= 0))
    assert (tokens[0, :n] == tokens[2, :n]).all()


def test_too_long_rows_are_truncated_or_rejected(tmp_path):
    rows = [
        {"prompt": "the quick brown fox " * 12, "response": "paris"},  # prompt fills the row
        {"prompt": "a", "response": "b c"},
        {"prompt": "a", "response": "the quick brown fox " * 12},  # reply cut at seq_len + 1
    ]
    meta = prepare_chat(
        _write_jsonl(tmp_path / "c.jsonl", rows),
        tmp_path / "o",
        tokenizer=chat_tokenizer(),
        seq_len=32,
    )
    assert (meta["counts"]["accepted"], meta["counts"]["rejected"], meta["truncated"]) == (2, 1, 1)
    assert "no trained tokens" in (tmp_path / "o" / "rejected.jsonl").read_text()
    ds = ChatDataset(tmp_path / "o" / "train")
    assert ds.tokens.sequence_lengths.max() == 33
    assert len(pack(np.array([33, 3, 3]), 32)[0]) == 2
