"""README.md is a user's guide: short, no development journal (commit hashes), and every link
to a guide in the repository leads to a file and heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_LINES = 220
# 7-40 hex characters with a digit and a letter a-f among them: a commit id, not a word or a number
SHA = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def commit_ids(text: str) -> list[str]:
    return SHA.findall(text)


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors: the heading lowercased, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def broken_links(markdown: str, base: Path) -> list[str]:
    broken = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or a heading of the README itself
        path, _, anchor = target.partition("#")
        file = base / path
        if not file.exists() or (anchor and anchor not in heading_anchors(file.read_text())):
            broken.append(target)
    return broken


def test_the_sha_pattern_finds_commit_ids_and_spares_words_and_numbers():
    assert commit_ids("measured at 73e9b7e and c211944e4f91842") == ["73e9b7e", "c211944e4f91842"]
    assert commit_ids("a defaced decade, 1234567 tokens, step-00000100, 0x1f") == []


def test_readme_has_no_commit_ids():
    assert commit_ids(README.read_text()) == []


def test_readme_stays_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move details into docs/"


def test_every_link_in_the_readme_leads_somewhere():
    text = README.read_text()
    assert "](docs/" in text
    assert broken_links(text, REPO) == []


def test_a_missing_guide_or_heading_is_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## The test suite and CI\n")
    text = "[a](docs/guide.md) [b](docs/gone.md) [c](docs/guide.md#the-test-suite-and-ci) "
    text += "[d](docs/guide.md#nowhere) [e](https://example.org/x)"
    assert broken_links(text, tmp_path) == ["docs/gone.md", "docs/guide.md#nowhere"]
