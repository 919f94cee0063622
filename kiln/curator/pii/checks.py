"""Check digits and address parsing: what separates real identifiers from look-alike numbers."""

from __future__ import annotations

import ipaddress
import re

_NON_DIGIT = re.compile(r"\D")
_NON_ALNUM = re.compile(r"[^0-9A-Za-z]")


def digits(text: str) -> str:
    return _NON_DIGIT.sub("", text)


def luhn(number: str) -> bool:
    """The Luhn checksum of payment cards (ISO/IEC 7812): double every second digit from the
    right, and the digit sum is a multiple of 10."""
    total = 0
    for i, ch in enumerate(reversed(number)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


# (lowest prefix, highest prefix, lengths) of the card networks, from their published IIN ranges
_CARD_NETWORKS = [
    (4, 4, (13, 16, 19)),  # Visa
    (51, 55, (16,)),  # Mastercard
    (2221, 2720, (16,)),  # Mastercard 2-series
    (34, 34, (15,)),  # American Express
    (37, 37, (15,)),
    (6011, 6011, (16, 17, 18, 19)),  # Discover
    (644, 649, (16, 17, 18, 19)),
    (65, 65, (16, 17, 18, 19)),
    (3528, 3589, (16, 17, 18, 19)),  # JCB
    (300, 305, (14, 16)),  # Diners Club
    (36, 36, (14, 16)),
    (38, 39, (16,)),
    (62, 62, (16, 17, 18, 19)),  # UnionPay
]


def payment_card(text: str) -> bool:
    """A card network's prefix and length (Visa, Mastercard, Amex, Discover, JCB, Diners,
    UnionPay), not one repeated digit, passing Luhn."""
    number = digits(text)
    if len(set(number)) == 1 or not luhn(number):
        return False
    return any(
        low <= int(number[: len(str(low))]) <= high and len(number) in lengths
        for low, high, lengths in _CARD_NETWORKS
    )


def iban(text: str) -> bool:
    """ISO 13616: the country code and check digits moved to the end, letters as 10..35, and
    the whole number is 1 modulo 97."""
    code = _NON_ALNUM.sub("", text).upper()
    if not 15 <= len(code) <= 34:
        return False
    rearranged = code[4:] + code[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def my_number(text: str) -> bool:
    """Japan's Individual Number (マイナンバー): 11 digits and a check digit. With P_n the n-th
    digit from the right of the first eleven and Q_n = n + 1 (n <= 6) or n - 5, the check digit
    is 0 when sum(P_n Q_n) mod 11 <= 1, else 11 minus that remainder."""
    number = digits(text)
    if len(number) != 12 or len(set(number)) == 1:
        return False
    body = number[:11]
    total = sum(int(p) * (n + 1 if n <= 6 else n - 5) for n, p in enumerate(reversed(body), 1))
    remainder = total % 11
    return int(number[11]) == (0 if remainder <= 1 else 11 - remainder)


def ipv6(text: str) -> bool:
    """A full or compressed IPv6 address (ipaddress decides); clock times like 12:30:45 and
    C++'s `std::vector` fail, since an address needs eight groups or a `::`."""
    if not re.search(r"[0-9A-Fa-f]", text) or text.count(":") < 2:
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def japanese_phone(text: str) -> bool:
    """A domestic Japanese number: 10 digits (landlines, 0120/0800 free dial) or 11 for mobiles,
    IP phones and 0800 (070/080/090, 050, 020, 060, 0800)."""
    number = digits(text)
    if len(number) == 10:
        return True
    return len(number) == 11 and number[:3] in {"070", "080", "090", "050", "020", "060"}


def international_phone(text: str) -> bool:
    """E.164: a country code and at most 15 digits in all; 8 at least (short codes aside)."""
    return 8 <= len(digits(text)) <= 15
