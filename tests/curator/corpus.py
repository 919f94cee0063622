"""A generated test corpus with known answers: planted exact and near duplicates (measured char
24-gram Jaccard), junk aimed at each filter, malformed lines of every kind, Japanese prose."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from kiln.curator.dedup.shingles import jaccard
from tests.curator.shingle_sets import shingle_set

WORDS = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "foot",
    "boy",
    "age",
    "policy",
    "process",
    "music",
    "market",
    "sense",
    "nation",
    "plan",
    "college",
    "interest",
    "death",
    "experience",
    "effect",
    "use",
    "class",
    "control",
    "care",
    "field",
    "development",
    "role",
    "effort",
    "rate",
    "heart",
    "drug",
    "show",
    "leader",
    "light",
    "voice",
    "wife",
    "police",
    "mind",
    "price",
    "report",
    "decision",
    "son",
    "view",
    "relationship",
    "town",
    "road",
    "arm",
    "difference",
    "value",
    "building",
    "action",
    "model",
    "season",
    "society",
    "tax",
    "director",
    "position",
    "player",
    "record",
    "paper",
    "space",
    "ground",
    "form",
    "event",
    "official",
    "matter",
    "center",
    "couple",
    "site",
    "project",
    "activity",
    "star",
    "table",
    "need",
    "court",
    "oil",
    "situation",
    "cost",
    "industry",
    "figure",
    "street",
    "image",
    "phone",
    "data",
    "picture",
    "practice",
    "piece",
    "land",
    "product",
    "doctor",
    "wall",
    "patient",
    "worker",
    "news",
    "test",
    "movie",
    "north",
    "love",
    "support",
    "technology",
    "step",
    "baby",
    "computer",
    "type",
    "attention",
    "film",
    "tree",
    "source",
    "organization",
    "hair",
    "window",
    "evidence",
    "population",
    "site",
    "garden",
    "river",
    "stone",
    "bridge",
    "forest",
    "mountain",
    "island",
    "harbor",
    "valley",
    "meadow",
    "village",
    "castle",
    "lantern",
    "blanket",
    "kettle",
]
VERBS = [
    "makes",
    "finds",
    "takes",
    "gives",
    "keeps",
    "builds",
    "moves",
    "holds",
    "shows",
    "brings",
    "reads",
    "writes",
    "opens",
    "carries",
    "follows",
    "meets",
]
ADJ = [
    "small",
    "large",
    "quiet",
    "bright",
    "early",
    "late",
    "careful",
    "simple",
    "strong",
    "gentle",
    "famous",
    "local",
    "modern",
    "ancient",
    "narrow",
]

JA_SENTENCES = [
    "今日は朝から雨が降っていたので、私は家で本を読んで過ごしました。",
    "駅の近くに新しいパン屋ができて、毎朝たくさんの人が並んでいます。",
    "祖母は毎年春になると、庭の桜の木の下で家族と一緒にお弁当を食べます。",
    "この町の図書館は古い建物ですが、中はとても静かで勉強しやすいです。",
    "週末に友人と山へ登り、頂上から見た景色は本当に美しかったです。",
    "最近は仕事が忙しくて、なかなか料理をする時間が取れません。",
    "子どもたちは公園で元気に走り回り、夕方まで楽しそうに遊んでいました。",
    "新しい言語を学ぶときは、毎日少しずつ続けることが大切だと思います。",
    "夏休みには海の近くの小さな旅館に泊まり、新鮮な魚料理を味わいました。",
    "電車の窓から田んぼが広がる風景を眺めていると、心が落ち着きます。",
    "兄は大学で物理学を研究していて、週に一度は実験のために遅くまで残ります。",
    "雪が積もった朝、近所の人たちと協力して道の雪かきをしました。",
    "母が作る味噌汁は、季節の野菜がたくさん入っていてとてもおいしいです。",
    "博物館では江戸時代の道具や着物が展示されていて、多くの発見がありました。",
    "猫は日当たりのよい窓辺で丸くなり、午後の間ずっと眠っていました。",
    "地域のお祭りでは、太鼓の音に合わせて大勢の人が踊りを楽しみます。",
    "先生は難しい問題を、身近な例を使ってわかりやすく説明してくれました。",
    "秋になると山の木々が赤や黄色に色づき、多くの観光客が訪れます。",
    "父は定年後に畑を借りて、トマトやきゅうりを育てるようになりました。",
    "会議の前に資料を読み直し、質問されそうな点を整理しておきました。",
]
# Technical prose as in man pages: Japanese sentences around ASCII commands, options and paths,
# each with its English counterpart (same order).
JA_TECH_SENTENCES = [
    "オプション -l を指定すると、ls はファイルの権限・所有者・サイズ・更新日時を一行ずつ表示する。",
    "--all (-a) を付けると、名前が . で始まる隠しファイルも一覧に含まれる。",
    "環境変数 LANG=ja_JP.UTF-8 を設定すると、メッセージは日本語で出力される。",
    "grep -r -n PATTERN dir/ は、ディレクトリ以下を再帰的に検索して行番号を付けて表示する。",
    "tar -czf backup.tar.gz ~/src/ で、ソースのディレクトリを gzip 圧縮したアーカイブにまとめる。",
    "関数 open() は、成功するとファイル・ディスクリプタを返し、"
    "失敗すると -1 を返して errno を設定する。",
    "errno が EINTR の場合は、シグナルによって中断されたので read(2) を再試行すればよい。",
    "git log --oneline -n 5 は、直近の五つのコミットを一行ずつ表示する。",
    "ssh -p 2222 user@host のように、-p でポート番号を指定して接続できる。",
    "/etc/fstab の各行は、デバイス・マウントポイント・"
    "ファイルシステム型・オプションを空白で区切る。",
    "chmod u+x script.sh を実行すると、所有者にだけ実行権限が追加される。",
    "find . -name '*.py' -mtime -7 は、七日以内に更新された Python ファイルを探す。",
    "malloc() が NULL を返した場合は、メモリーが足りないので呼び出し元でエラーを処理する。",
    "systemctl restart nginx.service でサービスを再起動し、journalctl -u nginx でログを確認する。",
    "make -j4 CC=clang は、四つのジョブを並列に走らせて clang でビルドする。",
    "pip install --user requests は、ホーム・ディレクトリの下にパッケージを導入する。",
    "-s, --size: 各ファイルの割り当てサイズを --block-size=SIZE の単位で表示する。",
    "-h, --human-readable: -l や -s と一緒に使うと、1K, 234M, 2G のような単位で表示する。",
    "-R, --recursive: サブディレクトリ (sub_dir/) を再帰的に一覧表示する。",
    "-t: 更新日時 (mtime) の新しい順に並べる。-r で逆順になる。",
    "--color[=WHEN]: 出力に色を付ける。WHEN は always, auto, never のどれか。",
    "-1 (数字の 1): 一行に一つのファイルを表示する。",
    "--time-style=STYLE: -l の日時の形式を full-iso, long-iso, iso, locale から選ぶ。",
    "-I, --ignore=PATTERN: シェルの PATTERN (*.o, *~) に一致する項目を表示しない。",
]
EN_TECH_SENTENCES = [
    "With the -l option, ls prints the permissions, owner, size and modification time of each "
    "file on its own line.",
    "Adding --all (-a) also lists hidden files whose names start with a dot.",
    "If the environment variable LANG=en_US.UTF-8 is set, messages are printed in English.",
    "grep -r -n PATTERN dir/ searches the directory recursively and prints matching lines with "
    "their numbers.",
    "tar -czf backup.tar.gz ~/src/ packs the source directory into a gzip-compressed archive.",
    "The function open() returns a file descriptor on success, and on failure it returns -1 and "
    "sets errno.",
    "If errno is EINTR, the call was interrupted by a signal, so read(2) can simply be retried.",
    "git log --oneline -n 5 shows the five most recent commits, one per line.",
    "As in ssh -p 2222 user@host, the -p option selects the port number to connect to.",
    "Each line of /etc/fstab lists the device, the mount point, the file system type and the "
    "options, separated by spaces.",
    "Running chmod u+x script.sh adds execute permission for the owner only.",
    "find . -name '*.py' -mtime -7 looks for Python files changed within the last seven days.",
    "When malloc() returns NULL, memory is exhausted and the caller must handle the error.",
    "systemctl restart nginx.service restarts the service, and journalctl -u nginx shows its log.",
    "make -j4 CC=clang runs four jobs in parallel and builds with clang.",
    "pip install --user requests installs the package under the home directory.",
    "-s, --size: print the allocated size of each file, in units of --block-size=SIZE.",
    "-h, --human-readable: with -l and -s, print sizes in units such as 1K, 234M and 2G.",
    "-R, --recursive: list subdirectories (sub_dir/) recursively.",
    "-t: sort by modification time (mtime), newest first. -r reverses the order.",
    "--color[=WHEN]: colorize the output. WHEN is one of always, auto or never.",
    "-1 (the digit one): list one file per line.",
    "--time-style=STYLE: choose the date format of -l from full-iso, long-iso, iso or locale.",
    "-I, --ignore=PATTERN: do not list entries matching the shell PATTERN (*.o, *~).",
]
# Option entries of a man page: (flags, Japanese description, English description).
TECH_OPTIONS = [
    (
        "-a, --all",
        "名前が . で始まる項目も無視しない。",
        "do not ignore entries starting with a dot.",
    ),
    ("-A, --almost-all", ". と .. は表示しない。", "do not list the implied . and .. entries."),
    ("-b, --escape", "表示できない文字を \\ddd の形で出力する。", "print octal escapes (\\ddd)."),
    ("-B, --ignore-backups", "~ で終わる項目を表示しない。", "do not list entries ending with ~."),
    (
        "-d, --directory",
        "ディレクトリの中身ではなく、それ自体を表示する。",
        "list directories themselves.",
    ),
    (
        "-F, --classify[=WHEN]",
        "種類を示す文字 (*/=>@|) を付ける。",
        "append an indicator (*/=>@|).",
    ),
    ("-i, --inode", "各ファイルの i-node 番号を表示する。", "print the index number of each file."),
    ("-k, --kibibytes", "ディスク使用量を 1024 バイト単位で表す。", "default to 1024-byte blocks."),
    (
        "-n, --numeric-uid-gid",
        "-l と同じだが、数値の UID と GID を表示する。",
        "like -l, with numeric ids.",
    ),
    ("-p, --indicator-style=slash", "ディレクトリに / を付ける。", "append / to directories."),
    ("-S", "ファイルサイズの大きい順に並べる。", "sort by file size, largest first."),
    ("-X", "拡張子のアルファベット順に並べる。", "sort alphabetically by entry extension."),
]
DE_SENTENCES = [
    "Der alte Bahnhof am Rande der Stadt wurde im letzten Jahr sorgfältig renoviert.",
    "Meine Schwester arbeitet als Ärztin in einem kleinen Krankenhaus auf dem Land.",
    "Am Wochenende fahren wir oft mit dem Fahrrad zum See und schwimmen dort.",
    "Die Bibliothek bietet jeden Donnerstag einen Lesekreis für junge Erwachsene an.",
    "Im Herbst sammeln die Kinder bunte Blätter und basteln daraus kleine Bilder.",
    "Unser Nachbar hat einen wunderschönen Garten mit vielen seltenen Rosen.",
    "Nach dem langen Winter freuen sich alle auf die ersten warmen Frühlingstage.",
    "Der Bäcker an der Ecke verkauft das beste Brot in der ganzen Gegend.",
    "Wir haben gestern Abend lange über die Zukunft unserer Stadt gesprochen.",
    "Das Museum zeigt eine Ausstellung über die Geschichte der Seefahrt.",
]


def sentence(rng: random.Random, n_words: tuple[int, int] = (8, 14), vocab=WORDS) -> str:
    n = rng.randint(*n_words)
    words = [
        rng.choice(ADJ) if i % 5 == 1 else rng.choice(VERBS) if i % 5 == 3 else rng.choice(vocab)
        for i in range(n)
    ]
    return " ".join(words).capitalize() + "."


def prose(rng: random.Random, n_sentences: int = 14, per_line: int = 2) -> str:
    sents = [sentence(rng) for _ in range(n_sentences)]
    lines = [" ".join(sents[i : i + per_line]) for i in range(0, len(sents), per_line)]
    return "\n".join(lines)


def japanese(rng: random.Random, n: int = 8) -> str:
    picks = rng.sample(JA_SENTENCES, n)
    return "\n".join("".join(picks[i : i + 2]) for i in range(0, n, 2))


def technical(rng: random.Random, lang: str, n: int = 6) -> str:
    """A man-page-like document: `n` technical sentences, then `n` option entries (flags on their
    own line, then the description), Japanese or English with the same ASCII parts."""
    pool = JA_TECH_SENTENCES if lang == "ja" else EN_TECH_SENTENCES
    picks = rng.sample(range(len(pool)), n)
    sep = "" if lang == "ja" else " "
    lines = [sep.join(pool[i] for i in picks[j : j + 2]) for j in range(0, n, 2)]
    for flags, ja, en in rng.sample(TECH_OPTIONS, n):
        lines += [flags, "    " + (ja if lang == "ja" else en.capitalize())]
    return "\n".join(lines)


def mutate_to(rng: random.Random, text: str, low: float, high: float) -> tuple[str, float]:
    """Replace words one at a time until the char 24-gram Jaccard falls into [low, high]."""
    base = shingle_set(text, 24)
    words = text.split(" ")
    order = list(range(len(words)))
    rng.shuffle(order)
    for i in order:
        words[i] = rng.choice(WORDS)
        cand = " ".join(words)
        j = jaccard(base, shingle_set(cand, 24))
        if j <= high:
            if j >= low:
                return cand, j
            break
    raise RuntimeError("could not hit the Jaccard window; try another seed")


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
