"""Lua scripts whose arguments have names, each sent by its SHA.

A script's ARGV is a list, so every caller and the script must agree on the
order of its values. `Lua` keeps that order in one place: it declares the
script's arguments by name and writes the script's first lines, which build
the tables the body reads (`a.call`, `prompts[i].field`), and it lays out the
caller's values in the same order. Per-record arguments (one group of values
per prompt, or per conversation) come after the single ones; a record may
also name its key, `KEYS[<offset> + i]` for the i-th record.

Each script is registered once per process (`redis.commands.core.Script`, its
SHA computed once) and called with the caller's client, so a pipeline of many
calls loads a script once and every call after the first is an EVALSHA.
"""
from __future__ import annotations

import json
from typing import Iterable, Sequence

import redis


class Lua:
    """A script: `prelude` (shared functions), then the argument tables, then `body`.

    `head`: the names of the single arguments, read as `a.<name>`. `each`: the names of one
    record's arguments; the records are the table named `records`, and each holds its key
    as `.key` where `key_offset` (a Lua expression, e.g. 'B') says where the records' keys
    start in KEYS.
    """

    def __init__(self, body: str, *, prelude: str = "", head: Sequence[str] = (), each: Sequence[str] = (),
                 records: str = "prompts", key_offset: str | None = None):
        self.head, self.each = tuple(head), tuple(each)
        self.source = prelude + self._tables(records, key_offset) + body

    def _tables(self, records: str, key_offset: str | None) -> str:
        named = ", ".join(f"{name} = ARGV[{i}]" for i, name in enumerate(self.head, start=1))
        lines = [f"local a = {{{named}}}\n"]
        if self.each:
            width, skip = len(self.each), len(self.head)
            fields = [f"{name} = ARGV[j + {i}]" for i, name in enumerate(self.each, start=1)]
            if key_offset is not None:
                fields.append(f"key = KEYS[{key_offset} + i]")
            lines.append(f"local {records} = {{}}\n"
                         f"for i = 1, (#ARGV - {skip}) / {width} do\n"
                         f"  local j = {skip} + {width} * (i - 1)\n"
                         f"  {records}[i] = {{{', '.join(fields)}}}\n"
                         f"end\n")
        return "".join(lines)

    def argv(self, head: dict | None = None, each: Iterable[Sequence] = ()) -> list:
        """ARGV for `head` (values by name; a name left out is '') and `each` (per record, the
        values in `self.each`'s order)."""
        values = [(head or {}).get(name, "") for name in self.head]
        for record in each:
            if len(record) != len(self.each):
                raise ValueError(f"a record of {self.each} has {len(record)} values")
            values.extend(record)
        return values

    def __call__(self, client: redis.Redis, keys: list, head: dict | None = None, each: Iterable[Sequence] = (),
                 pipe: redis.client.Pipeline | None = None):
        """Run it on `client` (or queue it on `pipe`, whose reply then holds the result)."""
        script = _REGISTERED.get(self.source)
        if script is None:
            script = _REGISTERED.setdefault(self.source, client.register_script(self.source))
        return script(keys=keys, args=self.argv(head, each), client=client if pipe is None else pipe)


_REGISTERED: dict[str, "redis.commands.core.Script"] = {}  # one per source, for every client


def lua_string(text: str) -> str:
    """`text` as a Lua string literal, for a constant a script shares with Python (ASCII:
    Redis's Lua 5.1 reads JSON's escapes of it, `\\n`, `\\"`, `\\\\`, alike)."""
    if not text.isascii():
        raise ValueError(f"{text!r} is not ASCII")
    return json.dumps(text)
