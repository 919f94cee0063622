"""llama.cpp's tokenizer for a `tokenizer.ggml.model = "llama"` vocabulary, restated in Python
from llama-vocab.cpp (`llm_tokenizer_spm_session` and the SPM branch of `tokenize`), as a peer
for the tests where llama.cpp itself cannot be installed.

- The text is cut at the user-defined tokens (and, parsing specials, the control and unknown
  ones), longest first.
- Each remaining fragment gets a " " before it when `add_space_prefix` is on and it starts the
  text or follows such a token; spaces become "▁".
- Its UTF-8 characters are joined pairwise, always the adjacent pair whose concatenation is the
  vocabulary token of highest score (ties: the leftmost), until no pair is a token; a piece that
  is no token falls back to its `<0xNN>` bytes.
- BOS goes first when `add_bos_token` is on (llama.cpp's default here), EOS last likewise.
"""

from __future__ import annotations

import heapq
from typing import Any

CONTROL, UNKNOWN, USER_DEFINED = 3, 2, 4


def _pieces(text: str, ids: dict[str, int], scores: list[float]) -> list[int]:
    symbols = list(text)
    prev = list(range(-1, len(symbols) - 1))
    nxt = [*range(1, len(symbols)), -1]
    queue: list[tuple[float, int, int, int]] = []

    def bigram(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        joined = symbols[left] + symbols[right]
        if joined in ids:  # max score first, then the leftmost
            heapq.heappush(queue, (-scores[ids[joined]], left, right, len(joined)))

    for i in range(1, len(symbols)):
        bigram(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not symbols[left] or not symbols[right] or len(symbols[left] + symbols[right]) != size:
            continue
        symbols[left], symbols[right] = symbols[left] + symbols[right], ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        bigram(prev[left], left)
        bigram(left, nxt[left])
    out: list[int] = []
    i = 0 if symbols else -1
    while i != -1:
        piece = symbols[i]
        if piece in ids:
            out.append(ids[piece])
        else:
            out.extend(ids[f"<0x{b:02X}>"] for b in piece.encode("utf-8"))
        i = nxt[i]
    return out


def tokenize(meta: dict[str, Any], text: str, parse_special: bool = True) -> list[int]:
    """The token ids llama.cpp gives `text` with the GGUF metadata `meta`."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    scores: list[float] = meta["tokenizer.ggml.scores"]
    types: list[int] = meta["tokenizer.ggml.token_type"]
    ids: dict[str, int] = {}
    for index, token in enumerate(tokens):
        ids.setdefault(token, index)
    kept = (USER_DEFINED, CONTROL, UNKNOWN) if parse_special else (USER_DEFINED,)
    specials = sorted(
        (i for i, kind in enumerate(types) if kind in kept), key=lambda i: -len(tokens[i])
    )
    fragments: list[str | int] = [text]
    for special in specials:  # partition the raw-text fragments at each occurrence
        split: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                split.append(fragment)
                continue
            parts = fragment.split(tokens[special])
            for k, part in enumerate(parts):
                if part:
                    split.append(part)
                if k < len(parts) - 1:
                    split.append(special)
        fragments = split
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
    out: list[int] = []
    if meta.get("tokenizer.ggml.add_bos_token", True):
        out.append(meta["tokenizer.ggml.bos_token_id"])
    after_special = True
    for fragment in fragments:
        if isinstance(fragment, int):
            out.append(fragment)
            after_special = True
            continue
        raw = (" " if prefix and after_special else "") + fragment
        out.extend(_pieces(raw.replace(" ", "\u2581"), ids, scores))
        after_special = False
    if meta.get("tokenizer.ggml.add_eos_token", False):
        out.append(meta["tokenizer.ggml.eos_token_id"])
    return out
