"""Reading prompt files: three input forms, one conversation shape, line by line.

Accepted lines (JSONL):
- `{"id": ..., "messages": [{"role": ..., "content": ...}, ...]}` (OpenAI chat)
- `{"id": ..., "prompt": "text"}` (one user turn)
- `{"id": ..., "conversations": [{"from": ..., "value": ...}, ...]}` (ShareGPT)

Any of them may carry `"sampling": {...}`, the line's own sampling parameters
over the run's, checked here as SGLang checks them (`contract/run/line_sampling.py`):
a value SGLang would refuse makes the line a `BadLine`, not a dead letter later.

A content may also be OpenAI's list of parts: text parts
(`{"type": "text", "text": ...}`, or `input_text`) are joined with one space,
as SGLang's chat endpoint does for a template that expects a string; any other
part (an image, audio) rejects the line rather than being dropped silently.

Invariant: whatever bytes a line holds, it becomes either a `Prompt` whose
strings the tokenizer, Redis and Parquet all accept, or a `BadLine` with its
number and reason; it never raises, so one line cannot stop the others. That
holds because every way a line can be wrong is checked here: invalid UTF-8, a
line over `max_line_bytes` (skipped without being held in memory), JSON that is
malformed or nested too deeply, a number or boolean or null where a string is
expected, a NUL character, and a lone surrogate (`"\\ud800"` is valid JSON but
no UTF-8 encoder accepts it). The file is streamed, so a file of millions of
lines never sits in memory. A line without an id gets a stable one derived
from its content.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from contract.run.line_sampling import BadSampling, check_line_sampling, json_kind

ROLES = {"system", "user", "assistant", "tool"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "chatgpt": "assistant", "tool": "tool",
                  "function": "tool", "observation": "tool"}
TEXT_PARTS = ("text", "input_text")
MAX_LINE_BYTES = 16 * 2**20   # `enqueue --max-line-bytes`: a longer line is reported and skipped
MAX_ID_BYTES = 512            # an id is part of a Redis field, a task id and a shard row
_SKIP_CHUNK = 2**20           # an over-long line is read past in pieces of this size
_BOM = b"\xef\xbb\xbf"


MESSAGE_KEYS = ("messages", "prompt", "conversations")  # the line's conversation; its other keys are its fields


@dataclass(frozen=True)
class Prompt:
    line: int
    id: str
    messages: list[dict]
    # the line's other top-level keys but `sampling` (`answer`, `id`, ...), which a verifier reads
    # (`enqueue --verify`: contract/run/verifiers.py), as the JSON gave them
    fields: dict = field(default_factory=dict, compare=False)
    sampling: dict | None = None  # the line's own `sampling` (contract/run/line_sampling.py), checked


def line_record(prompt: Prompt, verify: bool) -> dict | None:
    """What a worker reads of the prompt's line beyond its ids (contract/run/line_fields.py): its own
    sampling, and its fields where the run has a verifier (`verify`), which reads them; None: nothing."""
    record = {}
    if prompt.sampling:
        record["sampling"] = prompt.sampling
    if verify:
        record["fields"] = prompt.fields
    return record or None


@dataclass(frozen=True)
class BadLine:
    line: int
    reason: str


class InvalidPrompt(ValueError):
    pass


@dataclass(frozen=True)
class Columns:
    """Which field of a line (or column of a table) holds the conversation, and which the id
    (`enqueue --messages-column`, `--id-column`). `messages` None: the field named
    `messages`, `conversations` or `prompt`, whichever the line has (in that order); a
    named one is read in whichever of the three forms its value has (a string is a
    prompt, a list of `from`/`value` turns ShareGPT, else OpenAI messages), and the
    three default names are then not read as the conversation. An absent id field gives
    the line the id derived from its content, as a line without `id` gets."""
    messages: str | None = None
    id: str = "id"

    def apply(self, record: dict) -> dict:
        """The record with the named fields moved to the names `parse_record` reads."""
        if self.messages is None and self.id == "id":
            return record
        record = dict(record)
        if self.id != "id":
            value = record.pop(self.id, None)
            record.pop("id", None)
            if value is not None:
                record["id"] = value
        if self.messages is not None:
            if self.messages not in record:
                raise InvalidPrompt(f"no {self.messages!r} field (--messages-column)")
            value = record.pop(self.messages)
            for name in FORMS:
                record.pop(name, None)
            record[_form(value)] = value
        return record


FORMS = ("messages", "conversations", "prompt")
DEFAULT_COLUMNS = Columns()


def _form(value: object) -> str:
    """Which of the three input forms a named field's value is in."""
    if isinstance(value, str):
        return "prompt"
    if isinstance(value, list) and value and isinstance(value[0], dict) and "role" not in value[0] \
            and ("from" in value[0] or "value" in value[0]):
        return "conversations"
    return "messages"


def read_prompts(source: Path | BinaryIO, max_line_bytes: int = MAX_LINE_BYTES,
                 columns: Columns = DEFAULT_COLUMNS) -> Iterator[Prompt | BadLine]:
    """Yield each non-blank line of a JSONL file (a path, or an open binary file) as a Prompt or a BadLine."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as handle:
            yield from read_prompts(handle, max_line_bytes, columns)
        return
    for number, raw in _lines(source, max_line_bytes):
        if raw is None:
            yield BadLine(number, f"line longer than --max-line-bytes ({max_line_bytes:,} bytes)")
            continue
        if not raw.strip():
            continue
        try:
            yield parse_line(raw.removeprefix(_BOM) if number == 1 else raw, number, columns)
        except InvalidPrompt as exc:
            yield BadLine(number, str(exc))
        except Exception as exc:  # a case no rule above foresaw: still this line's fault only
            yield BadLine(number, f"unreadable line ({exc.__class__.__name__}: {exc})"[:500])


def mentions_line_fields(path: Path, chunk: int = 2**20) -> bool:
    """Whether some line of the file may carry its own `sampling` (its key's bytes occur anywhere):
    read in pieces and stopped at the first sight, so a file whose lines carry it costs a piece and
    one without costs a read of the file at disk speed. A prompt's text cannot hold the bytes
    (JSON escapes its quotes there), and a false sighting only costs a run one read a sample."""
    needle = b'"sampling"'
    tail = b""
    with open(path, "rb") as handle:
        while piece := handle.read(chunk):
            if needle in tail + piece:
                return True
            tail = piece[-(len(needle) - 1):]
    return False


def _lines(handle: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """(number, bytes) of each line; None for a line over `limit` bytes, which is read
    past in fixed pieces, so memory stays bounded by the limit whatever the file holds."""
    number = 0
    while raw := handle.readline(limit + 1):
        number += 1
        if len(raw) <= limit or raw.endswith(b"\n"):  # at most limit bytes before the newline
            yield number, raw
            continue
        while raw and not raw.endswith(b"\n"):
            raw = handle.readline(_SKIP_CHUNK)
        yield number, None


def parse_line(raw: bytes, number: int, columns: Columns = DEFAULT_COLUMNS) -> Prompt:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidPrompt(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        # the column in characters, counted from 1 (Python's own message names "line 1", the
        # line's own, and a 0-based offset); some of its messages end in " at", awaiting one
        raise InvalidPrompt(f"invalid JSON: {exc.msg.removesuffix(' at')} (column {exc.colno})") from None
    except RecursionError:
        raise InvalidPrompt("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise InvalidPrompt(f"invalid JSON: {exc}"[:300]) from None
    if not isinstance(record, dict):
        raise InvalidPrompt(f"not a JSON object but {json_kind(record)}")
    return parse_record(record, number, columns)


def parse_record(record: dict, number: int, columns: Columns = DEFAULT_COLUMNS) -> Prompt:
    """A line's object (or a table's row, `producer/prompt_tables.py`) as a Prompt: one
    path for every input form, so a row is checked exactly as a line is."""
    record = columns.apply(record)
    messages = _messages(record)
    fields = {k: v for k, v in record.items() if k not in MESSAGE_KEYS and k != "sampling"}
    try:
        sampling = check_line_sampling(record.get("sampling"))
    except BadSampling as exc:
        raise InvalidPrompt(str(exc)) from None
    return Prompt(number, _prompt_id(record, messages, sampling), messages, fields, sampling)


def _messages(record: dict) -> list[dict]:
    if "messages" in record:
        raw, role_key, content_key, roles = record["messages"], "role", "content", {r: r for r in ROLES}
    elif "conversations" in record:
        raw, role_key, content_key, roles = record["conversations"], "from", "value", SHAREGPT_ROLES
    elif "prompt" in record:
        return [{"role": "user", "content": _content(record["prompt"], "prompt")}]
    else:
        raise InvalidPrompt('no "messages", "prompt" or "conversations" field')
    if not isinstance(raw, list) or not raw:
        raise InvalidPrompt(f"messages must be a non-empty list, not {json_kind(raw)}")
    messages = []
    for index, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise InvalidPrompt(f"message {index} is not an object but {json_kind(turn)}")
        role = turn.get(role_key)
        if role is None or role == "":
            raise InvalidPrompt(f"message {index} has an empty or missing {role_key!r}")
        if not isinstance(role, str):
            raise InvalidPrompt(f"message {index} {role_key!r} is not a string but {json_kind(role)}")
        if role not in roles:
            raise InvalidPrompt(f"message {index} has unknown role {role[:50]!r}")
        content = _content(turn.get(content_key), f"message {index} {content_key}")
        messages.append({"role": roles[role], "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise InvalidPrompt("no user message")
    return messages


def _content(value: object, what: str) -> str:
    """A turn's text: a string, or OpenAI text parts joined with a space (as SGLang does)."""
    if isinstance(value, list):
        return _text(" ".join(_part_text(part, f"{what} part {i}") for i, part in enumerate(value)), what)
    if not isinstance(value, str):
        raise InvalidPrompt(f"{what} is not a string but {json_kind(value)}")
    return _text(value, what)


def _part_text(part: object, what: str) -> str:
    if not isinstance(part, dict):
        raise InvalidPrompt(f"{what} is not an object but {json_kind(part)}")
    kind = part.get("type")
    if kind not in TEXT_PARTS:
        raise InvalidPrompt(f"{what} has type {str(kind)[:50]!r}: only text parts are accepted")
    text = part.get("text")
    if not isinstance(text, str):
        raise InvalidPrompt(f"{what} text is not a string but {json_kind(text)}")
    return text


def _text(value: str, what: str) -> str:
    """The string itself, once sure that the tokenizer, Redis and Parquet all take it."""
    if "\x00" in value:
        raise InvalidPrompt(f"{what} holds a NUL character (\\u0000) at character {value.index(chr(0))}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidPrompt(f"{what} holds a lone surrogate ({ascii(value[exc.start])[1:-1]}) at character "
                            f"{exc.start}: not encodable as UTF-8") from None
    return value


def _prompt_id(record: dict, messages: list[dict], sampling: dict | None = None) -> str:
    """The line's id; or one derived from its messages, and its own sampling where it gives one
    (the same messages sampled two ways are two prompts; a line without sampling keeps the id it
    always had)."""
    value = record.get("id")
    if value is None:
        content = messages if sampling is None else {"messages": messages, "sampling": sampling}
        blob = json.dumps(content, sort_keys=True, ensure_ascii=False).encode()
        return "p-" + hashlib.sha256(blob).hexdigest()[:20]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise InvalidPrompt(f"id must be a non-empty string or integer, not {json_kind(value)}")
    text = _text(str(value), "id")
    if len(text.encode()) > MAX_ID_BYTES:
        raise InvalidPrompt(f"id longer than {MAX_ID_BYTES} bytes")
    return text
