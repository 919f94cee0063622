"""A generated test corpus with known answers: planted exact and near duplicates (measured char
24-gram Jaccard), junk aimed at each filter, malformed lines of every kind, Japanese prose."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from tests.curator.prose import DE_SENTENCES, VERBS, WORDS, japanese, mutate_to, prose, sentence


@dataclass
class Planted:
    docs: list[dict] = field(default_factory=list)
    raw_lines: list[bytes] = field(default_factory=list)  # malformed lines, written as bytes
    near_pairs: list[tuple[str, str, float]] = field(default_factory=list)
    exact_groups: list[list[str]] = field(default_factory=list)
    junk: dict[str, str] = field(default_factory=dict)  # id -> expected reason
    malformed: dict[str, str] = field(default_factory=dict)  # id -> expected reason
    japanese: list[str] = field(default_factory=list)
    clean_ids: list[str] = field(default_factory=list)


def junk_docs(rng: random.Random) -> dict[str, tuple[str, str]]:
    """reason -> (id, text): each violates its own rule and passes every rule applied before it."""
    p = prose
    short = "Too short to be a document."
    long_words = (
        " ".join(
            rng.choice(
                [
                    "internationalization",
                    "responsibilities",
                    "characterization",
                    "electroencephalogram",
                    "incomprehensibility",
                    "telecommunications",
                ]
            )
            for _ in range(80)
        )
        + "."
    )
    hashtags = p(rng) + "\n" + " ".join(f"#{rng.choice(WORDS)}" for _ in range(40))
    bullets = "\n".join("- " + sentence(rng) for _ in range(12))
    ellipsis = "\n".join(sentence(rng)[:-1] + "..." for _ in range(12))
    numbers = p(rng) + "\n" + " ".join(str(rng.randint(10, 99999)) for _ in range(80)) + "."
    short_vocab = [
        "cat",
        "dog",
        "sun",
        "red",
        "big",
        "old",
        "new",
        "hat",
        "map",
        "pen",
        "cup",
        "box",
    ]
    symbols = "\n".join(
        " ".join(f"(({rng.choice(short_vocab)}))" for _ in range(10)) + "." for _ in range(10)
    )
    digits = "\n".join(
        " ".join(f"a{rng.randint(1000, 9999)}" for _ in range(10)) + "." for _ in range(8)
    )
    line = sentence(rng)
    dup_lines = "\n".join([line] * 6 + [sentence(rng) for _ in range(6)])
    para = sentence(rng, (10, 12))
    dup_paras = "\n\n".join([para, para, para, "\n".join(sentence(rng, (3, 4)) for _ in range(24))])
    top = "\n".join(
        f"{sentence(rng, (4, 6))[:-1]} blue whale {rng.choice(VERBS)} blue whale today."
        for _ in range(16)
    )
    phrase = " ".join(rng.choice(WORDS) for _ in range(12))
    dup_ngrams = "\n".join(
        sentence(rng)[:-1] + " " + phrase + "." if i % 3 == 0 else sentence(rng) for i in range(14)
    )
    no_punct = "\n".join(sentence(rng)[:-1] for _ in range(12))
    lorem = p(rng) + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit."
    notices = [
        "Please enable JavaScript to see the {} map.",
        "This {} site needs JavaScript turned on.",
        "JavaScript must be allowed for the {} menu.",
        "Your browser blocks JavaScript on this {} page.",
        "Turn on JavaScript and reload the {} view.",
        "Without JavaScript the {} form cannot load.",
    ]
    js = "\n".join(
        notices[i // 2].format(rng.choice(WORDS)) if i % 2 else sentence(rng) for i in range(12)
    )
    braces = p(rng) + "\n" + " ".join("{" + rng.choice(WORDS) + "}" for _ in range(30))
    urls = (
        p(rng, 8)
        + "\n"
        + " ".join(
            f"https://example.com/{rng.choice(WORDS)}/{rng.randint(10**8, 10**9)}/index.html"
            for _ in range(8)
        )
    )
    german = "\n".join(rng.sample(DE_SENTENCES, 10))
    docs = {
        "word_count": short,
        "mean_word_length": long_words,
        "symbol_word_ratio": hashtags,
        "bullet_lines": bullets,
        "ellipsis_lines": ellipsis,
        "alpha_words": numbers,
        "non_alphanumeric": symbols,
        "digits": digits,
        "duplicate_lines": dup_lines,
        "duplicate_paragraphs": dup_paras,
        "top_ngrams": top,
        "duplicate_ngrams": dup_ngrams,
        "terminal_punctuation": no_punct,
        "lorem_ipsum": lorem,
        "javascript": js,
        "curly_braces": braces,
        "url_ratio": urls,
        "language": german,
    }
    return {reason: (f"junk-{reason}", text) for reason, text in docs.items()}


def make_corpus(
    seed: int = 0, n_clean: int = 60, n_pairs: int = 25, max_doc_chars: int = 20_000
) -> Planted:
    rng = random.Random(seed)
    out = Planted()

    def add(id_: str, text: str) -> None:
        out.docs.append({"id": id_, "text": text, "source": "generated"})

    for i in range(n_clean):
        add(f"clean-{i:04d}", prose(rng))
        out.clean_ids.append(f"clean-{i:04d}")
    for g in range(5):  # exact duplicates: groups of 2-3 copies
        text = prose(rng)
        ids = [f"exact-{g}-{k}" for k in range(2 + g % 2)]
        for id_ in ids:
            add(id_, text)
        out.exact_groups.append(ids)
    for name, (low, high) in {"95": (0.93, 0.97), "85": (0.855, 0.90), "60": (0.55, 0.62)}.items():
        for i in range(n_pairs):
            base = prose(rng)
            dup, j = mutate_to(rng, base, low, high)
            a, b = f"near{name}-{i:03d}-a", f"near{name}-{i:03d}-b"
            add(a, base)
            add(b, dup)
            out.near_pairs.append((a, b, j))
    for reason, (id_, text) in junk_docs(rng).items():
        add(id_, text)
        out.junk[id_] = reason
    for i in range(6):
        id_ = f"ja-{i:03d}"
        add(id_, japanese(rng))
        out.japanese.append(id_)
    # malformed lines of every kind
    bad = {
        "bad-json": (b'{"id": "bad-json", "text": "unterminated\n', "invalid_json"),
        "bad-utf8": (b'{"id": "bad-utf8", "text": "caf\xe9 \xff\xfe broken"}\n', "invalid_utf8"),
        "no-text": (b'{"id": "no-text", "body": "text under another key"}\n', "missing_text"),
        "num-text": (b'{"id": "num-text", "text": 12345}\n', "non_string_text"),
        "empty-text": (b'{"id": "empty-text", "text": "   \\n  "}\n', "empty_text"),
        "array": (b'["not", "an", "object"]\n', "not_an_object"),
        "huge": (
            json.dumps({"id": "huge", "text": prose(rng) * (max_doc_chars // 500)}).encode()
            + b"\n",
            "too_large",
        ),
    }
    for id_, (line, reason) in bad.items():
        out.raw_lines.append(line)
        out.malformed[id_] = reason
    rng.shuffle(out.docs)
    return out


def write_jsonl(planted: Planted, path: str) -> None:
    lines = [json.dumps(d, ensure_ascii=False).encode() + b"\n" for d in planted.docs]
    lines[len(lines) // 2 : len(lines) // 2] = planted.raw_lines
    with open(path, "wb") as f:
        f.writelines(lines)
