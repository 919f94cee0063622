"""Japanese words from a real tokenizer (filters.japanese_words: tokenizer, the `ja` extra): word
counts and mean word length equal MeCab's own segmentation, Latin text inside stays split on
spaces, English is unchanged, and a Japanese paragraph keeps while junk is rejected."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kiln.curator.config import CurateConfig
from kiln.curator.filters import DocBatch
from kiln.curator.filters import japanese as ja_module
from kiln.curator.filters.gopher import MeanWordLength
from kiln.curator.filters.japanese import JapaneseSegmenter
from kiln.curator.pipeline import Curation
from kiln.curator.process import ChunkProcessor
from kiln.platform.extras import MissingExtraError
from tests.curator.prose import japanese, prose, technical

fugashi = pytest.importorskip("fugashi", reason="the `ja` extra")

SENTENCES = [
    "吾輩は猫である。名前はまだ無い。",
    "東京都の人口は約千四百万人で、日本で最も多い。",
    "このコマンドはファイルの一覧を表示します。",
]

PARAGRAPH = (
    "日本語の文章は単語の間に空白を置かずに書かれるため、単語の数を数えるには形態素解析が必要"
    "である。形態素解析器は辞書と統計モデルを使って、文を意味のある最小の単位に分割する。\n"
    "例えば、ファイルを一覧するには「ls -l」を実行し、詳しい説明はマニュアルページで確認できる。"
    "設定ファイルは通常ホームディレクトリに置かれ、利用者が自由に編集できる。\n"
    "この段落は、品質フィルタが日本語の文書を英語の文書と同じ基準で判断できることを確かめる"
    "ための例である。文の長さや語彙はふつうの技術文書に近くなるように書かれている。"
)


@pytest.fixture(scope="module")
def segmenter() -> JapaneseSegmenter:
    return JapaneseSegmenter()


def _mecab_words(sentence: str) -> list[str]:
    """MeCab's tokens, with a token lacking letters and digits (punctuation) merged into the
    token before it."""
    words: list[str] = []
    for token in fugashi.Tagger()(sentence):
        if any(ch.isalnum() for ch in token.surface) or not words:
            words.append(token.surface)
        else:
            words[-1] += token.surface
    return words


def test_word_count_and_mean_length_equal_the_tokenizers(segmenter):
    batch = DocBatch(SENTENCES, segmenter=segmenter)
    assert batch.segmented.all()
    expected = [_mecab_words(s) for s in SENTENCES]
    assert batch.n_words.tolist() == [len(w) for w in expected]
    mean = MeanWordLength(None, None).statistic(batch)
    assert mean == pytest.approx([np.mean([len(x) for x in w]) for w in expected])
    # one word per character without the tokenizer: more words, every one of length 1
    assert (DocBatch(SENTENCES).n_words > batch.n_words).all()


def test_latin_inside_japanese_splits_on_spaces_and_english_is_unchanged(segmenter):
    text = "「ls -l」を実行する。foo_bar は 2 回。"
    words = DocBatch([text], segmenter=segmenter).words.values.to_pylist()
    assert words[:3] == ["「ls", "-l", "」を"]
    assert "foo_bar" in words and "実行" in words
    english = [prose(random.Random(s)) for s in range(3)]
    with_tok, without = DocBatch(english, segmenter=segmenter), DocBatch(english)
    assert not with_tok.segmented.any()
    assert with_tok.words.values.to_pylist() == without.words.values.to_pylist()


def _kept(texts: dict[str, str]) -> set[str]:
    proc = ChunkProcessor(CurateConfig(filters={"japanese_words": "tokenizer"}))
    recs = [{"id": k, "text": t, "source": "t", "reason": None} for k, t in texts.items()]
    kept, _, _ = proc.process(recs, np.arange(len(recs), dtype=np.int64))
    return set(kept.column("id").to_pylist())


def test_japanese_prose_keeps_and_junk_is_rejected():
    rng = random.Random(0)
    katakana = "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモ"
    nonsense = "の".join(
        "".join(rng.choice(katakana) for _ in range(14)) for _ in range(40)
    )  # unknown 14-character "words": mean word length far over 6
    texts = {
        "paragraph": PARAGRAPH,
        "generated": japanese(random.Random(1)),
        "man page": technical(random.Random(2), "ja"),
        "too short": "短い文です。",
        "nonsense": nonsense + "。",
        "repeated": "同じ文が何度も繰り返される。" * 40,
    }
    assert _kept(texts) == {"paragraph", "generated", "man page"}


def test_a_missing_ja_extra_is_one_line_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "in.jsonl").write_text('{"text": "日本語"}\n')
    monkeypatch.setattr(ja_module, "JA_MODULES", ("fugashi", "no_such_unidic_module"))
    cfg = CurateConfig(input=[str(tmp_path / "in.jsonl")], filters={"japanese_words": "tokenizer"})
    with pytest.raises(MissingExtraError, match=r"kiln\[ja\].*no_such_unidic_module"):
        Curation.prepare(cfg, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
