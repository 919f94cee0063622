"""Chat, instruction and preference rows: read JSONL / Parquet, normalise, reject bad rows.

Accepted shapes (one per row):

- chat: `{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}`
- instruction: `{"prompt", "response"}` or `{"input", "output"}` (an optional `"system"`)
- preference: `{"prompt" | "messages", "chosen", "rejected"}`; `chosen`/`rejected` are a string
  (one assistant reply) or a list of messages (the reply turns, as TRL's conversational format).

Every row read is either returned or written to the rejected file with its reason, so
`accepted + rejected == read` always holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kiln.platform.errors import InputError

ROLES = ("system", "user", "assistant")
Message = dict[str, str]


class BadRow(ValueError):
    """A row that cannot be used; the message is the reason written to the rejected file."""


@dataclass
class PreferencePair:
    """A shared prompt (messages ending on a user turn) and two assistant continuations."""

    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]


@dataclass
class RowCounts:
    read: int = 0
    accepted: int = 0
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "read": self.read,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "reasons": dict(self.reasons),
        }


def data_files(path: str | os.PathLike) -> list[str]:
    """A .jsonl/.json/.parquet file, or a directory of them (a Corpus from `curate` included)."""
    p = Path(path)
    if p.is_file():
        return [str(p)]
    if p.is_dir():
        files = sorted(
            str(f)
            for f in p.rglob("*")
            if f.suffix in (".jsonl", ".json", ".parquet") and not f.name.startswith(("_", "."))
        )
        if files:
            return files
    raise InputError(f"{path}: expected a .jsonl/.parquet file or a directory holding some")


def iter_rows(path: str | os.PathLike) -> Iterator[tuple[str, int, object]]:
    """(file, line/row number, row) for every row; an unparsable JSON line comes as a BadRow."""
    for file in data_files(path):
        if file.endswith(".parquet"):
            import pyarrow.parquet as pq

            table = pq.ParquetFile(file)
            n = 0
            for batch in table.iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    n += 1
                    yield file, n, row
            continue
        with open(file, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield file, n, json.loads(line)
                except json.JSONDecodeError as e:
                    yield file, n, BadRow(f"invalid JSON: {e.msg}")


def _text(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise BadRow(f"{key!r} must be a non-empty string")
    return value


def _messages(value, what: str) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise BadRow(f"{what!r} must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadRow(f"{what}[{i}] is not an object")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise BadRow(f"{what}[{i}].role {role!r} is not one of {list(ROLES)}")
        if not isinstance(content, str):
            raise BadRow(f"{what}[{i}].content must be a string")
        out.append({"role": role, "content": content})
    return out


def _check_turns(messages: list[Message], what: str) -> None:
    """system first (at most once), then user/assistant alternating, starting with user."""
    body = messages[1:] if messages[0]["role"] == "system" else messages
    for i, m in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        if m["role"] != expected:
            raise BadRow(f"{what}: turn {i} is {m['role']!r}, expected {expected!r}")


def to_conversation(row) -> list[Message]:
    """A chat or instruction row as messages ending on an assistant turn; BadRow otherwise."""
    if isinstance(row, BadRow):
        raise row
    if not isinstance(row, dict):
        raise BadRow("row is not an object")
    if "messages" in row:
        messages = _messages(row["messages"], "messages")
    else:
        prompt_key = "prompt" if "prompt" in row else "input"
        response_key = "response" if "response" in row else "output"
        if prompt_key not in row or response_key not in row:
            raise BadRow("expected 'messages', 'prompt'/'response' or 'input'/'output'")
        messages = [
            {"role": "user", "content": _text(row, prompt_key)},
            {"role": "assistant", "content": _text(row, response_key)},
        ]
        if isinstance(row.get("system"), str) and row["system"]:
            messages.insert(0, {"role": "system", "content": row["system"]})
    _check_turns(messages, "messages")
    if messages[-1]["role"] != "assistant":
        raise BadRow("messages: the last turn must be the assistant's")
    if not any(m["content"].strip() for m in messages if m["role"] == "assistant"):
        raise BadRow("messages: every assistant turn is empty")
    return messages


def _reply(value, what: str) -> list[Message]:
    if isinstance(value, str):
        if not value.strip():
            raise BadRow(f"{what!r} is empty")
        return [{"role": "assistant", "content": value}]
    messages = _messages(value, what)
    if messages[0]["role"] != "assistant" or messages[-1]["role"] != "assistant":
        raise BadRow(f"{what!r} must start and end with an assistant turn")
    return messages


def to_preference(row) -> PreferencePair:
    """A preference row as (prompt messages, chosen turns, rejected turns); BadRow otherwise."""
    if isinstance(row, BadRow):
        raise row
    if not isinstance(row, dict):
        raise BadRow("row is not an object")
    if "chosen" not in row or "rejected" not in row:
        raise BadRow("expected 'chosen' and 'rejected'")
    if "messages" in row:
        prompt = _messages(row["messages"], "messages")
    elif "prompt" in row and isinstance(row["prompt"], list):
        prompt = _messages(row["prompt"], "prompt")
    elif "prompt" in row:
        prompt = [{"role": "user", "content": _text(row, "prompt")}]
    else:
        raise BadRow("expected 'prompt' or 'messages'")
    _check_turns(prompt, "prompt")
    if prompt[-1]["role"] != "user":
        raise BadRow("prompt: the last turn must be the user's")
    chosen, rejected = _reply(row["chosen"], "chosen"), _reply(row["rejected"], "rejected")
    if chosen == rejected:
        raise BadRow("'chosen' and 'rejected' are identical")
    return PreferencePair(prompt, chosen, rejected)


class RejectedRows:
    """Writes rejected rows as JSONL: `{"file", "row", "reason", "data"}`, and counts them."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = None if path is None else str(path)
        self.counts = RowCounts()
        self._f = None

    def accept(self) -> None:
        self.counts.read += 1
        self.counts.accepted += 1

    def reject(self, file: str, row_number: int, reason: str, data) -> None:
        self.counts.read += 1
        self.counts.rejected += 1
        key = reason.split(":")[0][:60]
        self.counts.reasons[key] = self.counts.reasons.get(key, 0) + 1
        if self.path is None:
            return
        if self._f is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        data = None if isinstance(data, BaseException) else data
        record = {"file": file, "row": row_number, "reason": reason, "data": data}
        self._f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
