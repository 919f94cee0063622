"""Cleaning: Unicode repair (ftfy), NFC/NFKC, control characters, whitespace, C4 boilerplate
lines (PII is the next step: kiln.curator.pii). Batch-wise: cheap per-document gates decide where
ftfy must run, and the regex work runs on whole Arrow arrays (RE2)."""

from __future__ import annotations

import re
import unicodedata

import pyarrow as pa
import pyarrow.compute as pc

from kiln.curator.config import CleanConfig

# A document without any of these characters is left unchanged by ftfy.fix_text (apart from
# normalisation, done separately): mojibake always contains a Latin-1-range lead character, and the
# other ftfy steps touch entities, ligatures, full/half-width forms, odd line breaks, surrogates.
_FTFY_TRIGGER = re.compile(
    "[\x80-\xff\x1b\r\u2028\u2029\u3000\ufb00-\ufb06\uff00-\uffef\ufffd\ud800-\udfff]|&#?\\w+;"
)
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\x{200b}\x{feff}]"
_ODD_SPACES = r"[\x{00a0}\x{2000}-\x{200a}\x{202f}\x{205f}]"


def _ftfy_fix(text: str) -> str:
    import ftfy

    return ftfy.fix_text(text, normalization=None)


def _drop_lines(text: str, phrases: list[str]) -> str:
    return "\n".join(
        line for line in text.split("\n") if not any(p in line.lower() for p in phrases)
    )


class Cleaner:
    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg
        self.phrases = [p.lower() for p in cfg.boilerplate_phrases]

    def __call__(self, texts: list[str]) -> list[str]:
        cfg = self.cfg
        out = []
        for t in texts:
            if cfg.fix_unicode and _FTFY_TRIGGER.search(t):
                t = _ftfy_fix(t)
            # lone surrogates cannot be stored as UTF-8 (str.isascii is O(1) in CPython: ASCII
            # text skips the search)
            if not t.isascii() and _SURROGATE.search(t):
                t = t.encode("utf-8", "replace").decode("utf-8")
            if cfg.normalization != "none":  # (pyarrow's utf8_normalize does not compose)
                t = unicodedata.normalize(cfg.normalization, t)
            out.append(t)
        if not (cfg.remove_control_chars or cfg.normalize_whitespace or cfg.boilerplate_lines):
            return out  # no Arrow pass to make
        arr = pa.array(out, pa.large_string())
        if cfg.remove_control_chars:
            arr = pc.replace_substring_regex(arr, _CONTROL, "")
        if cfg.normalize_whitespace:
            arr = pc.replace_substring(arr, "\r\n", "\n")
            arr = pc.replace_substring_regex(arr, _ODD_SPACES, " ")
            arr = pc.replace_substring_regex(arr, r"[ \t]+\n", "\n")  # trailing spaces
            arr = pc.replace_substring_regex(arr, r"\n{3,}", "\n\n")
            arr = pc.utf8_trim_whitespace(arr)
        texts = arr.to_pylist()
        if cfg.boilerplate_lines and self.phrases:
            has = pc.match_substring_regex(
                arr, "|".join(map(re.escape, self.phrases)), ignore_case=True
            )
            texts = [
                _drop_lines(t, self.phrases) if h else t
                for t, h in zip(texts, has.to_pylist(), strict=True)
            ]
        return texts
