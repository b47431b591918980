"""Redis refusing writes: which refusal it is, and what the operator does about it.

Three replies mean "this Redis answers but takes no writes now", never "this
command is wrong": `OOM command not allowed` (used memory past `maxmemory`
under `noeviction`, the policy the fleet needs), `READONLY` (the URL points
at a replica, or the primary was demoted in a failover) and `NOREPLICAS`
(fewer healthy replicas than `min-replicas-to-write`). Each lifts by itself or
by an operator's hand, so producers stop with one line naming the cause and
the remedy (`producer/cli.py`) and workers pause until writes are accepted
again (`workers/intake/gate.py`). This is the one place that recognises them, for
redis-py's exceptions and for the kombu or Celery errors that wrap them
(`__cause__` / `__context__`, or only the reply text).

Invariant: `refusal(exc)` is not None exactly when `exc`, or an exception it
was raised from, is one of the three replies.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis


OUT_OF_MEMORY, READ_ONLY, NO_REPLICAS = "out of memory", "read-only", "no replicas"


@dataclass(frozen=True)
class WriteRefusal:
    cause: str   # "out of memory" | "read-only" | "no replicas"
    reply: str   # Redis's own words
    remedy: str

    def line(self) -> str:
        """One line for an operator: the cause, Redis's reply, the remedy."""
        return f"Redis refuses writes ({self.cause}: {self.reply}); {self.remedy}"


_REMEDIES = {
    OUT_OF_MEMORY: "raise maxmemory (CONFIG SET maxmemory, or the managed plan), or export and drop finished "
                     "runs; keep maxmemory-policy noeviction",
    READ_ONLY: "REDIS_URL points at a replica: point it at the primary (or use sentinel:// with "
                 "FLEET_SENTINEL_MASTER), or promote this one with REPLICAOF NO ONE",
    NO_REPLICAS: "the primary has fewer replicas than min-replicas-to-write: bring a replica back, or "
                   "lower min-replicas-to-write",
}
_PREFIXES = {"OOM": OUT_OF_MEMORY, "READONLY": READ_ONLY, "NOREPLICAS": NO_REPLICAS}
_TYPES = ((redis.exceptions.OutOfMemoryError, OUT_OF_MEMORY), (redis.exceptions.ReadOnlyError, READ_ONLY))


def refusal(exc: BaseException | None) -> WriteRefusal | None:
    """The write refusal behind `exc` (itself or what it was raised from), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found = _one(exc)
        if found is not None:
            return found
        exc = exc.__cause__ or exc.__context__
    return None


def _one(exc: BaseException) -> WriteRefusal | None:
    text = str(exc).strip().split(" caused error: ", 1)[-1]  # a pipeline's: drop the command and its data
    for kind, cause in _TYPES:
        if isinstance(exc, kind):  # redis-py strips the reply's code: put it back for the reader
            code = next(k for k, v in _PREFIXES.items() if v == cause)
            return WriteRefusal(cause, f"{code} {text}", _REMEDIES[cause])
    for code, cause in _PREFIXES.items():  # NOREPLICAS has no class; kombu may keep only the text
        if text.startswith(code + " ") or f"'{code} " in text or f'"{code} ' in text:
            return WriteRefusal(cause, text[text.index(code):].rstrip("'\")"), _REMEDIES[cause])
    return None
