"""PII detection and redaction: e-mail, phone numbers, IPv4/IPv6, payment cards, IBAN, Japan's
My Number, postcodes and secrets, found by Kiln's recognisers (regexes gated by RE2 over Arrow,
then check digits)."""

from kiln.curator.pii.recognizers import DEFAULT_TAGS, KINDS, RECOGNIZERS, Recognizer
from kiln.curator.pii.scanner import PiiCounts, PiiScanner

__all__ = ["DEFAULT_TAGS", "KINDS", "RECOGNIZERS", "PiiCounts", "PiiScanner", "Recognizer"]
