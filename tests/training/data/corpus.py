"""A small bilingual corpus the tests write themselves (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "Ray Data tokenises documents in parallel with actors that hold the tokenizer.",
    "Megatron-LM reads indexed datasets: a .bin file of tokens and a .idx file of offsets.",
    "It's 2026 and we're training a small language model on 2 CPU cores.",
]
JAPANESE = [
    "東京都に住んでいます。毎朝コーヒーを飲みます。",
    "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。",
    "カタカナとひらがなと漢字が混ざった文章をトークナイズします。",
    "機械学習のモデルを訓練するには、大量のテキストデータが必要です。",
]


def documents(n: int) -> list[str]:
    """n documents mixing the sentences above, deterministic."""
    pool = ENGLISH + JAPANESE
    return [" ".join(pool[(i * 7 + j) % len(pool)] for j in range(1 + i % 4)) for i in range(n)]


def write_corpus(root: Path, n: int = 400, shards: int = 3) -> Path:
    """A Corpus artifact: Parquet shards with id, text, source (+ a rejected/ folder to ignore)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kiln.platform.artifact import Artifact

    root.mkdir(parents=True, exist_ok=True)
    docs = documents(n)
    per = -(-n // shards)
    for s in range(shards):
        part = docs[s * per : (s + 1) * per]
        table = pa.table(
            {
                "id": [f"doc-{s * per + i}" for i in range(len(part))],
                "text": part,
                "source": ["test"] * len(part),
            }
        )
        pq.write_table(table, root / f"part-{s:05d}.parquet", compression="zstd")
    (root / "rejected").mkdir(exist_ok=True)
    pq.write_table(
        pa.table({"id": ["bad"], "text": ["rejected text"], "source": ["test"], "reason": ["dup"]}),
        root / "rejected" / "part-00000.parquet",
    )
    art = Artifact(
        uri=str(root),
        kind="Corpus",
        fingerprint="testcorpus",
        stage="test",
        counts={"documents": n},
    )
    art.commit()
    return root
