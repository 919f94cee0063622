"""Documents of known quality for the classifier and perplexity tests: spam, navigation
boilerplate and kana noise against clean prose, in English and Japanese."""

from __future__ import annotations

import random

from tests.curator.prose import JA_SENTENCES, WORDS, japanese, prose, technical

SPAM_EN = [
    "cheap",
    "best",
    "price",
    "buy",
    "now",
    "click",
    "here",
    "free",
    "shipping",
    "deal",
    "discount",
    "sale",
    "online",
    "casino",
    "bonus",
    "win",
    "offer",
    "limited",
    "top",
    "10",
]
SPAM_JA = [
    "激安",
    "通販",
    "送料無料",
    "今すぐ",
    "クリック",
    "最安値",
    "ポイント",
    "10倍",
    "限定",
    "セール",
    "無料",
    "登録",
    "稼げる",
    "人気",
    "ランキング",
    "お得",
    "特価",
    "まとめ",
]
NAV_EN = ["Home", "About", "Contact", "Login", "Sign up", "Cart (0)", "FAQ", "Blog", "Privacy"]
NAV_JA = ["ホーム", "会社概要", "お問い合わせ", "ログイン", "新規登録", "カート", "よくある質問"]
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのまみむめもやゆよらりるれろわをん"


def low_quality(rng: random.Random, lang: str) -> str:
    """Generated junk of four kinds: word salad, keyword spam, navigation, character noise."""
    kind = rng.randrange(4)
    if kind == 0:  # word salad: real words, no sentences
        pool = WORDS if lang == "en" else list("".join(JA_SENTENCES))
        sep = " " if lang == "en" else ""
        return "\n".join(sep.join(rng.choice(pool) for _ in range(30)) for _ in range(6))
    if kind == 1:
        pool = SPAM_EN if lang == "en" else SPAM_JA
        return "\n".join(" ".join(rng.choice(pool) for _ in range(12)) + "!!!" for _ in range(8))
    if kind == 2:
        pool = NAV_EN if lang == "en" else NAV_JA
        return "\n".join(" | ".join(rng.sample(pool, 5)) for _ in range(10))
    if lang == "en":
        letters = "abcdefghijklmnopqrstuvwxyz"
        return " ".join("".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(150))
    return "\n".join("".join(rng.choices(KANA, k=40)) for _ in range(8))


def high_quality(rng: random.Random, lang: str) -> str:
    """Reference-quality text: fluent prose or technical documentation."""
    if rng.random() < 0.5:
        return technical(rng, lang)
    return prose(rng) if lang == "en" else japanese(rng)


def quality_mix(rng: random.Random, n: int, good_share: float = 0.5) -> list[dict]:
    """n labelled documents, half English half Japanese: {id, text, lang, label high|low}."""
    docs = []
    for i in range(n):
        lang = "en" if i % 2 else "ja"
        good = rng.random() < good_share
        text = high_quality(rng, lang) if good else low_quality(rng, lang)
        docs.append(
            {"id": f"q{i:05d}", "text": text, "lang": lang, "label": "high" if good else "low"}
        )
    return docs
