"""How long a Redis call waits out an outage: the fleet's retries, except on a thread that must not wait.

A shared client (`connections.redis_for`) retries a call through a Redis
restart or a failover: up to 30 tries, backing off to 5 s between them (about
two minutes), because a task thread that waits loses nothing and a ledger
write that gives up would. One thread must never wait like that: a worker's
event loop (Celery's consumer thread). It is what notices that the broker is
gone, reconnects, and fetches; kombu's short calls on it (the restore sweep's
lock, an event publish, the batched take, a queue's declaration) share the
worker's client and its few connections (`workers/intake/redis_pool.py`), and
one of them retrying through an outage held the loop for minutes, so the worker
noticed the loss late and took nothing meanwhile (py-spy: the loop inside the
sweep's lock, in `Retry.call_with_retry`, a minute after Redis stopped).

So a thread marks itself `failing_fast()` and every call it makes, on any
client built here, tries once more only when a connection was dropped (a pooled
connection that Redis or a network cut closed: the next try reconnects), at once,
and never waits out a timeout or a refused connection. The policy is the
connection's (redis-py's retry lives on each pooled connection, not on the
client), so `SharedRetry` reads the mark of the thread that makes the call:
the same connections serve both kinds of caller, and the worker's connection
count is unchanged. Nor does such a thread wait long for a free connection
(`PoolWait`): during an outage the other threads hold the pool's few
connections for as long as they retry (seen next: the loop waiting in
`BlockingConnectionPool.get_connection` once its own calls failed fast).
And once such a wait ran out, that thread's next waits on the pool are
`STARVED_WAIT` (a busy pool's milliseconds, not an outage's minutes) until it
gets a connection again (`STARVED_FOR` at most): during an
outage the loop's backlog (an acknowledgement for each task that gave up)
would otherwise cost it `FAIL_FAST_WAIT` each, one after another, and a
backlog that grows as fast as it drains kept it from ever reading its broker
connection and noticing the loss (seen: 31 acknowledgements, 2 s each, a
minute after Redis was SIGKILLed, with task threads retrying on both connections).
kombu and Celery treat a connection error on the event loop as a lost broker
(reconnect, and skip a sweep or a publish until then), as they did with
kombu's own clients, which never retried.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

RETRIES, BACKOFF_BASE, BACKOFF_CAP = 30, 0.2, 5.0  # the fleet's: a restart or a failover, ~2 minutes
# A thread failing fast: one more try, at once, only for a dropped connection (never a timeout,
# which a frozen Redis would make twice as long)
FAIL_FAST = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
# seconds a thread failing fast waits for a free connection of a shared pool: a busy pool's calls
# free one within milliseconds, while during an outage the retrying threads hold them for minutes.
# The event loop meets it once per timer due: a worker frozen while Redis stopped noticed 20 s
# after it went on at 5 s, up to 12 s at 2 s. A Redis stalled past it reads as a lost broker,
# which costs a reconnect, never a prompt.
FAIL_FAST_WAIT = 2.0
# seconds after a thread failing fast found no free connection within FAIL_FAST_WAIT during which it
# waits STARVED_WAIT at most (unless it gets one meanwhile): an outage is evident, its backlog drains.
STARVED_FOR, STARVED_WAIT = 10.0, 0.05

_marks = threading.local()


class SharedRetry(Retry):
    """The fleet's retries, or `FAIL_FAST` for a call made by a thread inside `failing_fast()`."""

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        policy = FAIL_FAST if _failing() else super()
        return policy.call_with_retry(do, fail, is_retryable, with_failure_count)


class PoolWait:
    """A blocking pool's wait for a free connection (redis-py reads it as `timeout` at each
    checkout): `FAIL_FAST_WAIT` at most for a thread failing fast, `STARVED_WAIT` while such a wait
    has lately run out (`STARVED_FOR`), the pool's own otherwise."""

    _starved_at = float("-inf")  # when a thread failing fast last found no free connection in time

    @property
    def timeout(self) -> float | None:
        if not _failing():
            return self._wait
        if time.monotonic() - self._starved_at < STARVED_FOR:
            return STARVED_WAIT
        return FAIL_FAST_WAIT if self._wait is None else min(self._wait, FAIL_FAST_WAIT)  # None: for ever

    @timeout.setter
    def timeout(self, seconds: float | None) -> None:
        self._wait = seconds

    def get_connection(self, *args, **kwargs):
        if not _failing():
            return super().get_connection(*args, **kwargs)
        try:
            connection = super().get_connection(*args, **kwargs)
        except redis.ConnectionError as exc:
            if str(exc) == "No connection available.":  # redis-py's words for a wait that ran out
                self._starved_at = time.monotonic()
            raise
        self._starved_at = float("-inf")
        return connection


def shared() -> Retry:
    """The retry of a shared client's connections (`connections.redis_for`)."""
    return SharedRetry(ExponentialBackoff(cap=BACKOFF_CAP, base=BACKOFF_BASE), retries=RETRIES)


def _failing() -> bool:
    return getattr(_marks, "depth", 0) > 0


@contextmanager
def failing_fast() -> Iterator[None]:
    """Every Redis call this thread makes meanwhile fails fast (see the module docstring)."""
    _marks.depth = getattr(_marks, "depth", 0) + 1
    try:
        yield
    finally:
        _marks.depth -= 1
