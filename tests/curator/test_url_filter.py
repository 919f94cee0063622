"""URL blocklists: listed domains and their subdomains are dropped whatever the URL's case, port,
user info, trailing dot or IDN spelling; look-alikes are kept; blocklist files in hosts / adblock /
URL form are read; through curate the reason is `url_blocklist`, counts are conserved, and the
output is the same on Ray Data + Dask-on-Ray as inline on Dask threads."""

from __future__ import annotations

import glob
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kiln.curator import CurateConfig, curate
from kiln.curator.filters.url_blocklist import UrlBlocklist, host_of, load_blocklist
from kiln.platform.errors import InputError
from tests.curator.prose import prose

BLOCKED = [  # every one is example.com, spam.net or bücher.de, or a subdomain of one
    "https://example.com/a",
    "http://EXAMPLE.COM",
    "https://www.example.com:8443/x?y=1",
    "http://user:pw@ads.Example.com./path",
    "example.com/no-scheme",
    "//cdn.example.com/lib.js",
    "https://spam.net",
    "https://deep.sub.spam.net/page#frag",
    "http://bücher.de/buch",
    "http://xn--bcher-kva.de/",
    "https://SHOP.Bücher.DE:80/",
]
KEPT = [  # look-alikes, other hosts, no host at all
    "https://notexample.com/",
    "https://example.com.evil.org/",
    "https://example.co/",
    "http://spam.network/",
    "https://bucher.de/",
    "https://[2001:db8::1]/x",
    "mailto:someone",
    "",
    None,
]


def test_hosts_are_normalised():
    assert host_of("http://user@WWW.Example.COM.:8080/x") == "www.example.com"
    assert host_of("bücher.de/x") == "xn--bcher-kva.de"
    assert host_of("https://[2001:DB8::1]:443/") == "2001:db8::1"
    assert host_of(None) is None and host_of("") is None


def test_listed_domains_and_subdomains_are_blocked_and_look_alikes_kept():
    f = UrlBlocklist(["Example.com", "spam.net.", "bücher.de"])
    assert f.blocked(BLOCKED).all()
    assert not f.blocked(KEPT).any()


def test_blocklist_files_in_common_formats(tmp_path):
    path = tmp_path / "block.txt"
    path.write_text(
        "# a comment\n\n0.0.0.0 ads.tracker.io\n||Spam.net^\n*.example.com\n"
        "https://bücher.de/shop\nplain.org  # trailing comment\n",
        encoding="utf-8",
    )
    assert load_blocklist([str(path), "EXTRA.dev"]) == {
        "ads.tracker.io",
        "spam.net",
        "example.com",
        "xn--bcher-kva.de",
        "plain.org",
        "extra.dev",
    }
    with pytest.raises(InputError, match="url_blocklist.*not found"):
        load_blocklist([str(tmp_path / "missing" / "list.txt")])


@pytest.fixture(scope="module")
def urls_corpus(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("url-blocklist")
    rng = random.Random(3)
    docs, blocked = [], set()
    for i in range(60):
        url = (BLOCKED + KEPT)[i % (len(BLOCKED) + len(KEPT))]
        doc = {"id": f"d{i:03d}", "text": prose(rng)}
        if url is not None:
            doc["link"] = url
        if url in BLOCKED:
            blocked.add(doc["id"])
        docs.append(doc)
    with open(tmp_path / "in.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    (tmp_path / "block.txt").write_text("example.com\n||spam.net^\n", encoding="utf-8")
    return tmp_path, docs, blocked


def _config(root, **overrides) -> CurateConfig:
    body = {
        "input": [str(root / "in.jsonl")],
        "read": {"url_field": "link", "chunk_docs": 16},
        "filters": {"url_blocklist": [str(root / "block.txt"), "bücher.de"]},
        "dedup": {"fuzzy": {"enabled": False}},
        "output": {"plot": False, "shard_docs": 20},
        "actors": 2,
    }
    return CurateConfig.model_validate(body | overrides)


def _rejected(out) -> dict[str, str]:
    return {r["id"]: r["reason"] for r in pq.read_table(f"{out}/rejected").to_pylist()}


def _shards(out) -> list[bytes]:
    return [Path(p).read_bytes() for p in sorted(glob.glob(f"{out}/shard-*.parquet"))]


@pytest.fixture(scope="module")
def local_run(urls_corpus):
    root = urls_corpus[0]
    return curate(_config(root, stream="inline", cluster="local"), str(root / "local"))


def test_curate_rejects_them_as_url_blocklist_and_conserves_counts(urls_corpus, local_run):
    root, docs, blocked = urls_corpus
    report = local_run
    assert report["documents_in"] == len(docs) == report["kept"] + report["rejected"]
    rejected = _rejected(root / "local")
    assert {i for i, r in rejected.items() if r == "url_blocklist"} == blocked
    assert report["removed_by_reason"]["url_blocklist"] == len(blocked) > 0
    shards = glob.glob(f"{root}/local/shard-*")
    kept = {i for p in shards for i in pq.read_table(p)["id"].to_pylist()}
    assert kept | set(rejected) == {d["id"] for d in docs} and not kept & set(rejected)


@pytest.mark.slow
def test_same_output_on_ray_data_and_dask_on_ray(ray_session, urls_corpus, local_run):
    root = urls_corpus[0]
    curate(_config(root, stream="ray", cluster="ray"), str(root / "ray"))
    assert _rejected(root / "ray") == _rejected(root / "local")
    assert _shards(root / "ray") == _shards(root / "local") != []
