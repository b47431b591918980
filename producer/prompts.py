"""Reading prompt files: three input forms, one conversation shape, line by line.

Accepted lines (JSONL):
- `{"id": ..., "messages": [{"role": ..., "content": ...}, ...]}` (OpenAI chat)
- `{"id": ..., "prompt": "text"}` (one user turn)
- `{"id": ..., "conversations": [{"from": ..., "value": ...}, ...]}` (ShareGPT)

The file is streamed, so a file of millions of lines never sits in memory. A
malformed line becomes a `BadLine` with its number and reason; the rest go on.
A line without an id gets a stable one derived from its content.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

ROLES = {"system", "user", "assistant", "tool"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "chatgpt": "assistant", "tool": "tool",
                  "function": "tool", "observation": "tool"}


@dataclass(frozen=True)
class Prompt:
    line: int
    id: str
    messages: list[dict]


@dataclass(frozen=True)
class BadLine:
    line: int
    reason: str


class InvalidPrompt(ValueError):
    pass


def read_prompts(source: Path | BinaryIO) -> Iterator[Prompt | BadLine]:
    """Yield each non-blank line of a JSONL file (a path, or an open binary file) as a Prompt or a BadLine."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as handle:
            yield from read_prompts(handle)
        return
    for number, raw in enumerate(source, start=1):
        if not raw.strip():
            continue
        try:
            yield parse_line(raw, number)
        except InvalidPrompt as exc:
            yield BadLine(number, str(exc))


def parse_line(raw: bytes, number: int) -> Prompt:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidPrompt(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidPrompt(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(record, dict):
        raise InvalidPrompt(f"not a JSON object but {type(record).__name__}")
    messages = _messages(record)
    return Prompt(number, _prompt_id(record, messages), messages)


def _messages(record: dict) -> list[dict]:
    if "messages" in record:
        raw, role_key, content_key, roles = record["messages"], "role", "content", {r: r for r in ROLES}
    elif "conversations" in record:
        raw, role_key, content_key, roles = record["conversations"], "from", "value", SHAREGPT_ROLES
    elif "prompt" in record:
        raw, role_key, content_key, roles = [{"role": "user", "content": record["prompt"]}], "role", "content", {"user": "user"}
    else:
        raise InvalidPrompt('no "messages", "prompt" or "conversations" field')
    if not isinstance(raw, list) or not raw:
        raise InvalidPrompt("messages must be a non-empty list")
    messages = []
    for index, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise InvalidPrompt(f"message {index} is not an object")
        role = turn.get(role_key)
        if not isinstance(role, str) or not role:
            raise InvalidPrompt(f"message {index} has an empty or missing {role_key!r}")
        if role not in roles:
            raise InvalidPrompt(f"message {index} has unknown role {role!r}")
        content = turn.get(content_key)
        if not isinstance(content, str):
            raise InvalidPrompt(f"message {index} content is not a string")
        messages.append({"role": roles[role], "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise InvalidPrompt("no user message")
    return messages


def _prompt_id(record: dict, messages: list[dict]) -> str:
    value = record.get("id")
    if value is None:
        blob = json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()
        return "p-" + hashlib.sha256(blob).hexdigest()[:20]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise InvalidPrompt(f"id must be a non-empty string or integer, not {value!r}")
    return str(value)
