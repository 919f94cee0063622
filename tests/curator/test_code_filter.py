"""Code filters: the vectorised statistics equal NeMo Curator's / StarCoder's per-file definitions;
`filters.preset: code` keeps real source files and rejects each kind of junk under its own rule,
with counts conserved and the same output on Ray Data + Dask-on-Ray as inline."""

from __future__ import annotations

import glob
import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kiln.curator import CurateConfig, curate
from kiln.curator.config import FilterConfig
from kiln.curator.filters import DocBatch, build_filters
from kiln.curator.filters.code import (
    CodeAlpha,
    CodeCommentRatio,
    CodeLines,
    CodeMaxLineLength,
    CodeMeanLineLength,
)

PY_BODY = [
    "def area_of_circle(radius):",
    '    """Return the area of a circle with the given radius."""',
    "    return 3.14159 * radius * radius",
    "",
    "",
    "class Inventory:",
    "    # keeps items by name; counts never go below zero",
    "    def __init__(self):",
    "        self.items = {}",
    "",
    "    def add(self, name, count=1):",
    "        self.items[name] = self.items.get(name, 0) + count",
    "",
    "    def remove(self, name, count=1):",
    "        left = self.items.get(name, 0) - count  # clamp at zero",
    "        self.items[name] = max(left, 0)",
]
C_BODY = [
    "#include <stdio.h>",
    "#include <string.h>",
    "",
    "/* Reverse a string in place and print it. */",
    "static void reverse(char *s) {",
    "    size_t n = strlen(s);",
    "    for (size_t i = 0; i < n / 2; i++) {",
    "        char t = s[i];  // swap the ends",
    "        s[i] = s[n - 1 - i];",
    "        s[n - 1 - i] = t;",
    "    }",
    "}",
    "",
    "int main(void) {",
    '    char word[] = "http://example.com";',
    "    reverse(word);",
    '    printf("%s\\n", word);',
    "    return 0;",
    "}",
]


def good_files(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        body = PY_BODY if i % 2 else C_BODY
        lines = [ln.replace("radius", f"r{rng.randrange(100)}") for ln in body]
        out.append("\n".join(lines) + "\n")
    return out


JUNK = {  # reason -> a file that only that rule rejects
    "code_lines": "int x = 1;  // one\nint y = 2;\n",
    "code_xml_header": '<?xml version="1.0"?>\n' + "\n".join(C_BODY),
    "code_max_line_length": "\n".join(C_BODY) + '\nchar *blob = "' + "ab" * 700 + '";\n',
    "code_mean_line_length": "\n".join(
        [f"x{i} = compute(alpha, beta, gamma) + " + "value_" * 17 + "z  # note" for i in range(12)]
    ),
    "code_alpha": "# table\n"
    + "\n".join(", ".join(f"{v:.3f}" for v in range(9)) for _ in range(20)),
    "code_comment_ratio": "\n".join(ln for ln in C_BODY if "//" not in ln and "/*" not in ln),
}


def _reference(text: str) -> dict[str, float]:
    """NeMo Curator's per-document definitions, in plain Python."""
    lengths = [len(x) for x in text.split("\n")]
    return {
        "lines": text.count("\n") + 1,
        "max": max(lengths),
        "mean": (len(text) + 1) / len(lengths) - 1,
        "alpha": sum(map(str.isalpha, text)) / len(text),
    }


def test_statistics_equal_the_reference_definitions():
    rng = random.Random(0)
    alphabet = "ab Z9_\n\n  é日#(){};\t"
    texts = ["".join(rng.choices(alphabet, k=rng.randint(1, 300))) for _ in range(200)]
    texts += good_files(rng, 4) + list(JUNK.values())
    batch = DocBatch(texts)
    ref = [_reference(t) for t in texts]
    assert CodeLines(None, None).statistic(batch).tolist() == [r["lines"] for r in ref]
    assert CodeMaxLineLength(None, None).statistic(batch).tolist() == [r["max"] for r in ref]
    np.testing.assert_allclose(
        CodeMeanLineLength(None, None).statistic(batch), [r["mean"] for r in ref]
    )
    np.testing.assert_allclose(CodeAlpha(None, None).statistic(batch), [r["alpha"] for r in ref])


def test_comments_are_found_and_urls_and_preprocessor_lines_are_code():
    texts = [
        "x = 1  # set x\n",
        "#include <a.h>\nint main() {}\n",
        'url = "http://a.b/c"\n',
        "/* a\n b */ int x;\n",
        'def f():\n    """Doc."""\n',
    ]
    ratio = CodeCommentRatio(None, None).statistic(DocBatch(texts))
    comment_chars = [len(" # set x"), 0, 0, len("/* a\n b */"), len('"""Doc."""')]
    np.testing.assert_allclose(
        ratio, [c / len(t) for c, t in zip(comment_chars, texts, strict=True)]
    )


def test_preset_code_switches_prose_rules_off_unless_set():
    names = [f.name for f in build_filters(FilterConfig(preset="code"))]
    assert names[0] == "code_lines" and "word_count" not in names and "language" not in names
    cfg = FilterConfig.model_validate({"preset": "code", "min_words": 5, "code": {"min_lines": 3}})
    assert cfg.min_words == 5 and cfg.code.min_lines == 3 and cfg.max_words is None
    assert "code_lines" not in [f.name for f in build_filters(FilterConfig())]


@pytest.fixture(scope="module")
def code_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("code-filter")
    docs = [
        {"id": f"good{i:02d}", "text": t} for i, t in enumerate(good_files(random.Random(1), 24))
    ]
    docs += [{"id": f"junk-{reason}", "text": t} for reason, t in JUNK.items()]
    with open(root / "code.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    return root, docs


def _config(root, **overrides) -> CurateConfig:
    body = {
        "input": [str(root / "code.jsonl")],
        "read": {"chunk_docs": 8},
        "filters": {"preset": "code"},
        "dedup": {"exact": False, "fuzzy": {"enabled": False}},
        "output": {"plot": False, "shard_docs": 10},
        "actors": 2,
    }
    return CurateConfig.model_validate(body | overrides)


def read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def _rejected(out) -> dict[str, str]:
    return {r["id"]: r["reason"] for r in pq.read_table(f"{out}/rejected").to_pylist()}


@pytest.fixture(scope="module")
def local_run(code_corpus):
    root = code_corpus[0]
    return curate(_config(root, stream="inline", cluster="local"), str(root / "local"))


def test_each_junk_file_fails_its_own_rule_and_real_code_is_kept(code_corpus, local_run):
    root, docs = code_corpus
    assert local_run["documents_in"] == len(docs) == local_run["kept"] + local_run["rejected"]
    assert _rejected(root / "local") == {f"junk-{reason}": reason for reason in JUNK}
    assert local_run["kept"] == 24


@pytest.mark.slow
def test_same_output_on_ray_data_and_dask_on_ray(ray_session, code_corpus, local_run):
    root = code_corpus[0]
    curate(_config(root, stream="ray", cluster="ray"), str(root / "ray"))
    assert _rejected(root / "ray") == _rejected(root / "local")
    shards = [sorted(glob.glob(f"{root}/{run}/shard-*.parquet")) for run in ("local", "ray")]
    assert [read_bytes(p) for p in shards[1]] == [read_bytes(p) for p in shards[0]]
