"""Kiln's PII recognisers: a regex per type (valid as both RE2 and Python `re`, ASCII classes),
an optional check that rejects look-alikes (Luhn, mod 97, check digits, address parsing), and
the tag a match is replaced with. Order matters: a span redacted by an earlier type is gone for
the later ones (a card number is never also a phone number)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.curator.pii import checks

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CARD = r"[0-9]{4}(?:[ -]?[0-9]{4}){2}[ -]?[0-9]{1,7}|[0-9]{4}[ -]?[0-9]{6}[ -]?[0-9]{5}"
_MY_NUMBER = r"[0-9]{4}[ -]?[0-9]{4}[ -]?[0-9]{4}"
# not a piece of a longer digit group ("4111 1111 1111" of a 16-digit card)
_ALONE = r"(?<![0-9])(?<![0-9][ -])(?:{})(?![ -]?[0-9])"
_IPV6 = r"(?:[0-9A-Fa-f]{1,4}:|::)(?:[0-9A-Fa-f]{0,4}:){0,7}[0-9A-Fa-f]{0,4}"
# "::" not followed by a third colon, so "address:::1" finds "::1"
_IPV6_ALONE = r"(?<![0-9A-Za-z])" + _IPV6.replace("|::)", "|::(?!:))", 1) + r"(?![0-9A-Za-z])"


@dataclass(frozen=True)
class Recognizer:
    """`pattern` is Python `re` (lookarounds allowed); `gate`, RE2 for Arrow, finds the
    documents worth scanning (a superset of `pattern`'s; default: `pattern` itself)."""

    kind: str
    pattern: str
    tag: str
    check: Callable[[str], bool] | None = None
    gate: str = ""


SECRET = "|".join(
    [
        # PEM private-key blocks (RSA, EC, DSA, OPENSSH, ENCRYPTED, PKCS#8)
        r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z]+ )*PRIVATE KEY-----",
        r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b",  # AWS access key ids
        r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b",  # GitHub tokens
        r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b",  # GitHub fine-grained tokens
        r"\bxox[abposr]-[A-Za-z0-9-]{10,250}\b",  # Slack tokens
        r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{32,250}\b",  # OpenAI / Anthropic-style keys
    ]
)

RECOGNIZERS: list[Recognizer] = [
    Recognizer("secret", SECRET, "<SECRET>"),
    Recognizer(
        "email",
        r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
        "<EMAIL>",
    ),
    Recognizer(
        "iban",
        r"\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b",
        "<IBAN>",
        checks.iban,
    ),
    Recognizer(
        "credit_card",
        _ALONE.format(_CARD),
        "<CREDIT_CARD>",
        checks.payment_card,
        gate=_CARD,
    ),
    Recognizer(
        "my_number",
        _ALONE.format(_MY_NUMBER),
        "<MY_NUMBER>",
        checks.my_number,
        gate=_MY_NUMBER,
    ),
    # a dotted quad not inside a longer dotted run (versions like 1.2.3.4.5) nor after "v"
    Recognizer(
        "ip",
        rf"(?<![0-9A-Za-z.]){_OCTET}(?:\.{_OCTET}){{3}}(?![0-9]|\.[0-9])",
        "<IP_ADDRESS>",
        gate=rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    ),
    Recognizer(
        "ip",
        _IPV6_ALONE,
        "<IP_ADDRESS>",
        checks.ipv6,
        gate=_IPV6,
    ),
    Recognizer(
        "phone",
        r"\+[1-9][0-9]{0,2}[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,4}(?:[ .-]?[0-9]{2,4}){1,4}\b",
        "<PHONE_NUMBER>",
        checks.international_phone,
    ),
    Recognizer(
        "phone",
        r"(?:\b0[0-9]{1,4}-|\(0[0-9]{1,4}\) ?)[0-9]{1,4}-[0-9]{3,4}\b|\b0[5-9]0[0-9]{8}\b",
        "<PHONE_NUMBER>",
        checks.japanese_phone,
    ),
    Recognizer("phone", r"\([0-9]{3}\) ?[0-9]{3}-[0-9]{4}\b", "<PHONE_NUMBER>"),  # US
    # Japanese postcodes after the 〒 mark; US ZIP+4 (a bare 5-digit ZIP is any number)
    Recognizer("postcode", r"〒 ?[0-9]{3}-?[0-9]{4}\b|\b[0-9]{5}-[0-9]{4}\b", "<POSTCODE>"),
]

KINDS = ["secret", "email", "iban", "credit_card", "my_number", "ip", "phone", "postcode"]
DEFAULT_TAGS = {r.kind: r.tag for r in RECOGNIZERS}
