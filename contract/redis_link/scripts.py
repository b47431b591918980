"""Lua scripts whose arguments have names, each sent by its SHA.

A script's ARGV is a list, so every caller and the script must agree on the
order of its values. `Lua` keeps that order in one place: it declares the
script's arguments by name and writes the script's first lines, which build
the tables the body reads (`a.call`, `prompts[i].field`), and it lays out the
caller's values in the same order. Per-record arguments (one group of values
per prompt, or per conversation) come after the single ones; a record may
also name its key, `KEYS[<offset> + i]` for the i-th record.

Each script is registered once per process (`redis.commands.core.Script`, its
SHA computed once) and called with the caller's client: an EVALSHA, loaded
again by redis-py where Redis answers NOSCRIPT.

**In a pipeline, no question first.** redis-py asks Redis whether a pipeline's
scripts exist (`SCRIPT EXISTS`) before every pipeline that holds one: a round
trip more for each group commit, and, behind replicas, for each intake. On
this machine a round trip costs Redis 60-110 us of CPU whatever it carries
(`python -m bench --parts fleet`), so a client of the fleet's own pools
(`connections.py`) loads every script this process defines on each connection
it opens (`load_all`, a connect callback: a new server after a failover or a
restart is a new connection), and its pipelines send a plain EVALSHA. A script
first defined after a connection opened is loaded once on first use. A client
built elsewhere keeps redis-py's way.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
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
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        _SOURCES[self.sha] = self.source

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
        args = self.argv(head, each)
        if pipe is not None and LOADER.serves(pipe):
            if self.sha not in LOADER.loaded_once:  # defined after some connection opened
                client.script_load(self.source)
                LOADER.loaded_once.add(self.sha)
            return pipe.evalsha(self.sha, len(keys), *keys, *args)
        script = _REGISTERED.get(self.source)
        if script is None:
            script = _REGISTERED.setdefault(self.source, client.register_script(self.source))
        return script(keys=keys, args=args, client=client if pipe is None else pipe)


_REGISTERED: dict[str, "redis.commands.core.Script"] = {}  # one per source, for every client
_SOURCES: dict[str, str] = {}  # SHA1 -> source of every script this process defines
log = logging.getLogger(__name__)


class ScriptLoader:
    """Loads every script this process defines on each connection a fleet pool opens (module
    docstring). redis-py keeps a connect callback as a weak method: this one object lives as
    long as the process."""

    def __init__(self) -> None:
        self.loaded_once: set[str] = set()  # scripts loaded since their definition (any connection)
        self.refused = False  # Redis refused SCRIPT LOAD once: every pipeline goes redis-py's way
        self._lock = threading.Lock()

    def serves(self, pipe) -> bool:
        """Whether `pipe`'s connections all had every script loaded when they connected."""
        return not self.refused and getattr(pipe.connection_pool, "loads_scripts", False)

    def attach(self, connection) -> None:
        """Called for each connection a fleet pool makes (`connections.py`)."""
        connection.register_connect_callback(self.load_all)

    def load_all(self, connection) -> None:
        """Every script defined so far, loaded on the server `connection` just reached (one
        pipelined round trip)."""
        with self._lock:
            sources = dict(_SOURCES)
        try:
            for source in sources.values():
                connection.send_command("SCRIPT", "LOAD", source)
            for _ in sources:
                connection.read_response()
        except redis.ResponseError as exc:  # an ACL without SCRIPT: redis-py's way, said once
            if not self.refused:
                log.warning("Redis refuses SCRIPT LOAD on connect (%s): each pipeline asks SCRIPT EXISTS first", exc)
            self.refused = True
            return
        with self._lock:
            self.loaded_once.update(sources)


LOADER = ScriptLoader()


def lua_string(text: str) -> str:
    """`text` as a Lua string literal, for a constant a script shares with Python (ASCII:
    Redis's Lua 5.1 reads JSON's escapes of it, `\\n`, `\\"`, `\\\\`, alike)."""
    if not text.isascii():
        raise ValueError(f"{text!r} is not ASCII")
    return json.dumps(text)
