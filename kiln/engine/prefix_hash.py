"""Chained hashes of full KV blocks (vLLM's automatic prefix caching): a block's hash covers its
parent's hash, its own tokens and the request's extra keys, so equal hashes mean equal prefixes
up to and including that block, and a block can be shared by every sequence that starts so.

BLAKE2b over the token ids' bytes: a collision would hand one request another's keys/values, so
the hash is a 128-bit cryptographic one rather than Python's `hash` (which an adversarial
prompt can collide, as vLLM found when it moved to SHA-256).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def hash_block(parent: bytes | None, tokens: Sequence[int], extra: str | None = None) -> bytes:
    """The hash of one full block. `extra` (an adapter name, a cache salt) keeps otherwise equal
    prefixes apart; it is given for the first block and inherited through the chain."""
    h = hashlib.blake2b(parent or b"\0" * 16, digest_size=16)
    h.update(array("q", tokens).tobytes())
    if extra is not None:
        h.update(b"\xff" + extra.encode())
    return h.digest()


def extend_hashes(
    hashes: list[bytes], tokens: Sequence[int], block_size: int, extra: str | None = None
) -> list[bytes]:
    """Append to `hashes` (those of the first len(hashes) blocks of `tokens`) the hashes of the
    other full blocks of `tokens`; returns `hashes`."""
    for i in range(len(hashes), len(tokens) // block_size):
        parent = hashes[i - 1] if i else None
        chunk = tokens[i * block_size : (i + 1) * block_size]
        hashes.append(hash_block(parent, chunk, None if i else extra))
    return hashes
