"""Reading prompt lines: every kind of bad line has its reason, and no line can raise."""
from __future__ import annotations

import io
import tracemalloc

import pytest

from producer.prompts import MAX_LINE_BYTES, BadLine, Prompt, parse_line, read_prompts

USER = b'"role": "user"'

# (the line, a part of the reason it must be reported with)
BAD_LINES = [
    (b'{"id": "u1", "prompt": "caf\xe9"}', "invalid UTF-8 at byte"),
    (b"\xff\xfe{}", "invalid UTF-8 at byte 0"),
    (b"{not json", "invalid JSON"),
    (b'{"id": "j1", "prompt": "x"} trailing', "invalid JSON: Extra data"),
    (b"[" * 50_000 + b"]" * 50_000, "invalid JSON: nested too deeply"),
    (b'{"a": ' * 5_000 + b"1" + b"}" * 5_000, "invalid JSON: nested too deeply"),
    (b'{"id": ' + b"9" * 5_000 + b', "prompt": "x"}', "invalid JSON: Exceeds the limit"),
    (b"[1, 2, 3]", "not a JSON object but an array"),
    (b'"just a string"', "not a JSON object but a string"),
    (b"null", "not a JSON object but null"),
    (b'{"id": "x1", "text": "no messages"}', 'no "messages", "prompt" or "conversations" field'),
    (b'{"id": "x2", "messages": []}', "messages must be a non-empty list"),
    (b'{"id": "x3", "messages": "hello"}', "messages must be a non-empty list, not a string"),
    (b'{"id": "x4", "messages": [42]}', "message 0 is not an object but a number"),
    (b'{"id": "x5", "messages": [{"role": "", "content": "hi"}]}', "message 0 has an empty or missing 'role'"),
    (b'{"id": "x6", "messages": [{"content": "hi"}]}', "message 0 has an empty or missing 'role'"),
    (b'{"id": "x7", "messages": [{"role": 1, "content": "hi"}]}', "message 0 'role' is not a string but a number"),
    (b'{"id": "x8", "messages": [{"role": true, "content": "hi"}]}', "'role' is not a string but a boolean"),
    (b'{"id": "x9", "messages": [{"role": "wizard", "content": "hi"}]}', "message 0 has unknown role 'wizard'"),
    (b'{"id": "c1", "messages": [{' + USER + b', "content": 42}]}', "message 0 content is not a string but a number"),
    (b'{"id": "c2", "messages": [{' + USER + b', "content": false}]}', "content is not a string but a boolean"),
    (b'{"id": "c3", "messages": [{' + USER + b', "content": null}]}', "message 0 content is not a string but null"),
    (b'{"id": "c4", "messages": [{' + USER + b'}]}', "message 0 content is not a string but null"),
    (b'{"id": "c5", "messages": [{' + USER + b', "content": {"text": "hi"}}]}', "content is not a string but an object"),
    (b'{"id": "c6", "prompt": 12}', "prompt is not a string but a number"),
    (b'{"id": "c7", "prompt": null}', "prompt is not a string but null"),
    (b'{"id": "c8", "conversations": [{"from": "human", "value": 7}]}', "message 0 value is not a string but a number"),
    (b'{"id": "p1", "messages": [{' + USER + b', "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
     "message 0 content part 0 has type 'image_url': only text parts are accepted"),
    (b'{"id": "p2", "messages": [{' + USER + b', "content": ["plain"]}]}',
     "message 0 content part 0 is not an object but a string"),
    (b'{"id": "p3", "messages": [{' + USER + b', "content": [{"type": "text", "text": 5}]}]}',
     "message 0 content part 0 text is not a string but a number"),
    (b'{"id": "p4", "messages": [{' + USER + b', "content": [{"text": "no type"}]}]}',
     "message 0 content part 0 has type 'None'"),
    (b'{"id": "n1", "prompt": "a\\u0000b"}', "prompt holds a NUL character (\\u0000) at character 1"),
    (b'{"id": "n2", "messages": [{' + USER + b', "content": [{"type": "text", "text": "\\u0000"}]}]}',
     "message 0 content holds a NUL character"),
    (b'{"id": "s1", "prompt": "ok \\ud800"}', "prompt holds a lone surrogate (\\ud800) at character 3"),
    (b'{"id": "s2", "prompt": "\\udfff tail"}', "lone surrogate (\\udfff)"),
    (b'{"id": "s3", "conversations": [{"from": "human", "value": "\\ud83d"}]}', "message 0 value holds a lone surrogate"),
    (b'{"id": "\\ud800", "prompt": "x"}', "id holds a lone surrogate"),
    (b'{"id": "a\\u0000b", "prompt": "x"}', "id holds a NUL character"),
    (b'{"id": 1.5, "prompt": "x"}', "id must be a non-empty string or integer, not a number (1.5)"),
    (b'{"id": true, "prompt": "x"}', "id must be a non-empty string or integer, not a boolean (true)"),
    (b'{"id": "", "prompt": "x"}', "id must be a non-empty string or integer, not an empty string"),
    (b'{"id": ["x"], "prompt": "x"}', "id must be a non-empty string or integer, not an array"),
    (b'{"id": "' + b"i" * 600 + b'", "prompt": "x"}', "id longer than 512 bytes"),
    (b'{"id": "x10", "messages": [{"role": "system", "content": "only a system turn"}]}', "no user message"),
]


@pytest.mark.parametrize("line,reason", BAD_LINES, ids=[r for _, r in BAD_LINES])
def test_each_kind_of_bad_line_is_named_with_its_number_and_reason(line, reason):
    # Given a good line, the bad one, and another good line
    source = io.BytesIO(b'{"id": "before", "prompt": "a"}\n' + line + b'\n{"id": "after", "prompt": "b"}\n')

    # When the file is read
    items = list(read_prompts(source))

    # Then the bad line is line 2 with its reason, and both good lines are prompts
    assert [type(i) for i in items] == [Prompt, BadLine, Prompt]
    assert items[1].line == 2 and reason in items[1].reason, items[1].reason
    assert [items[0].id, items[2].id] == ["before", "after"]


def test_text_parts_are_joined_with_a_space_as_sglang_does():
    line = (b'{"id": "t", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}, '
            b'{"type": "input_text", "text": "world"}]}]}')
    assert parse_line(line, 1).messages == [{"role": "user", "content": "Hello world"}]


def test_accepted_lines_keep_their_text_and_ids():
    # integer ids become strings, a null id gets a derived one, valid non-BMP escapes are text
    assert parse_line(b'{"id": 7, "prompt": "x"}', 1).id == "7"
    derived = parse_line(b'{"id": null, "prompt": "x"}', 1).id
    assert derived.startswith("p-") and derived == parse_line(b'{"prompt": "x"}', 1).id
    assert parse_line(b'{"id": "e", "prompt": "\\ud83d\\ude00"}', 1).messages[0]["content"] == "\U0001F600"


def test_a_byte_order_mark_opens_the_first_line_only():
    items = list(read_prompts(io.BytesIO(b'\xef\xbb\xbf{"id": "a", "prompt": "x"}\n\xef\xbb\xbf{"id": "b"}\n')))
    assert isinstance(items[0], Prompt) and items[0].id == "a"
    assert isinstance(items[1], BadLine) and "BOM" in items[1].reason


def test_blank_lines_are_skipped_but_counted():
    items = list(read_prompts(io.BytesIO(b'\n   \n{"id": "a", "prompt": "x"}\n\r\n{bad\n')))
    assert [(type(i), i.line) for i in items] == [(Prompt, 3), (BadLine, 5)]


def test_the_line_limit_counts_the_bytes_before_the_newline():
    # Given a limit of 40 bytes, a line of exactly 40 and one of 41, with and without a final newline
    exact = b'{"id": "a", "prompt": "' + b"x" * 15 + b'"}'
    assert len(exact) == 40
    longer = exact[:-2] + b'y"}'
    for tail in (b"\n", b""):
        items = list(read_prompts(io.BytesIO(exact + b"\n" + longer + tail + (b"\n" if tail else b"")),
                                  max_line_bytes=40))
        # Then the first is a prompt, the second a bad line that names the limit
        assert isinstance(items[0], Prompt)
        assert isinstance(items[1], BadLine) and items[1].line == 2
        assert "longer than --max-line-bytes (40 bytes)" in items[1].reason


def test_the_default_line_limit_is_16_mib():
    assert MAX_LINE_BYTES == 16 * 2**20


class _Endless(io.RawIOBase):
    """A file whose first line is `size` bytes long, produced on demand (never held whole)."""

    def __init__(self, size: int, after: bytes):
        self.left, self.after = size, after

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.left:
            n = min(len(buffer), self.left)
            buffer[:n] = b"x" * n
            self.left -= n
            return n
        n = min(len(buffer), len(self.after))
        buffer[:n], self.after = self.after[:n], self.after[n:]
        return n


def test_an_over_long_line_is_skipped_without_being_held_in_memory():
    # Given a 64 MiB first line, then a good line, and a 1 MiB limit
    source = io.BufferedReader(_Endless(64 * 2**20, b'\n{"id": "next", "prompt": "x"}\n'))

    # When it is read
    tracemalloc.start()
    items = list(read_prompts(source, max_line_bytes=2**20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    # Then the long line is reported, the next one read, and memory stayed near the limit
    assert isinstance(items[0], BadLine) and items[0].line == 1
    assert isinstance(items[1], Prompt) and items[1].id == "next" and items[1].line == 2
    assert peak < 8 * 2**20, peak
