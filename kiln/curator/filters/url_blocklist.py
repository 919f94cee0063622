"""URL blocklists: drop documents whose URL's host is a listed domain or one of its subdomains.

The blocklist is domains given in the config and/or files of domains, one a line (`#` comments;
hosts-file lines `0.0.0.0 ads.example`, adblock lines `||ads.example^`, `*.example` and whole
URLs are read too, as UT1 / Blocklist Project / FineWeb lists come). Hosts are compared lowercased,
without port, user info or trailing dot, and as punycode (`bücher.de` = `xn--bcher-kva.de`), so
`http://User@WWW.Example.COM:8080/x` matches `example.com`. Documents without a URL pass.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import numpy as np

from kiln.curator.filters.base import DocumentFilter
from kiln.curator.filters.batch import DocBatch
from kiln.platform.errors import InputError


def normalize_host(host: str) -> str:
    """Lowercase ASCII (punycode) host without trailing dot; IPs and odd names kept as given."""
    host = host.strip().strip("[]").rstrip(".").lower()
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:  # an over-long label or a name IDNA refuses: compare it as written
        return host


def host_of(url: str | None) -> str | None:
    """The normalised host of a URL (`example.com/x` without a scheme works too), or None."""
    if not url or not isinstance(url, str):
        return None
    url = url.strip()
    if "://" not in url[:16] and not url.startswith("//"):
        url = "//" + url
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return normalize_host(host) if host else None


def parse_entry(line: str) -> str | None:
    """One blocklist line -> a normalised domain (None for blanks and comments)."""
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    line = line.split()[-1]  # hosts-file form: "0.0.0.0 ads.example"
    line = line.removeprefix("||").split("^", 1)[0].removeprefix("*.").removeprefix(".")
    if "/" in line or ":" in line:
        return host_of(line)
    return normalize_host(line) or None


def load_blocklist(entries: list[str], field: str = "filters.url_blocklist") -> set[str]:
    """Domains from the config: each entry is a file of domains (if it exists) or a domain."""
    domains: set[str] = set()
    for entry in entries:
        if os.path.isfile(entry):
            with open(entry, encoding="utf-8", errors="replace") as f:
                domains.update(d for d in map(parse_entry, f) if d)
        elif os.sep in entry and "://" not in entry:
            raise InputError(f"{field}: {entry}: blocklist file not found")
        elif (d := parse_entry(entry)) is not None:
            domains.add(d)
    return domains


class UrlBlocklist(DocumentFilter):
    name = "url_blocklist"

    def __init__(self, domains: set[str] | list[str]):
        self.domains = {normalize_host(d) for d in domains}
        self._cache: dict[str, bool] = {}

    @classmethod
    def from_config(cls, entries: list[str]) -> UrlBlocklist:
        return cls(load_blocklist(entries))

    def blocked_host(self, host: str | None) -> bool:
        """The host or any parent domain of it is listed."""
        if host is None:
            return False
        hit = self._cache.get(host)
        if hit is None:
            labels = host.split(".")
            hit = any(".".join(labels[i:]) in self.domains for i in range(len(labels)))
            if len(self._cache) < 1_000_000:
                self._cache[host] = hit
        return hit

    def blocked(self, urls: list[str | None]) -> np.ndarray:
        return np.array([self.blocked_host(host_of(u)) for u in urls], dtype=bool)

    def keep(self, batch: DocBatch) -> np.ndarray:
        if batch.urls is None:
            return np.ones(len(batch), dtype=bool)
        return ~self.blocked(batch.urls)
