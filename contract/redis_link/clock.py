"""One clock for the fleet: Redis's, so a worker whose own clock is off never misjudges a time another wrote.

Every time one process writes and another compares (a lease's score, a
heartbeat's age, the minute a sample was stored in) is read on Redis's clock
(`TIME`), never the local wall clock: two workers whose clocks are ten minutes
apart would otherwise see each other's fresh leases as long expired, or their
stale ones as fresh.

A `TIME` round trip per reading would cost a delivery one more call, so the
clock keeps the offset between Redis's time and this process's monotonic clock
(which no clock adjustment moves), measured at the midpoint of one `TIME` call,
and reads `now()` from it without I/O. `sync` measures again; the lease keeper
calls it every round, so the monotonic clock's own drift never accumulates.
The first reading of a process that never synced measures once.

**Its error is bounded, and known.** Redis answered somewhere within the call,
so a midpoint is off by at most half the round trip. A call that met an outage
takes seconds: the shared client's retries wait out a failover, and a frozen
primary answers when it thaws (12 s in `tests/test_sentinel_failover.py`).
Taken as is, such a reading set the clock seconds ahead, for the 30 s until the
next round: the heartbeats written meanwhile were dated after a second
worker's check had begun though they were taken before it, and both workers
generated a prompt (`workers/intake/deliveries.elsewhere`). So `sync` reads
again, up to `READINGS` times, until a round trip is short (`SHORT_S`), keeps
the shortest, and adopts it only where it is more accurate than what the clock
has (its reading's half round trip, plus `DRIFT` of the time since). `earliest`
and `latest` are the bounds: what one process dates and another compares with
takes them, so a comparison that says "after" holds whatever the two errors.
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

import redis

READINGS = 3       # TIME calls one sync makes at most
SHORT_S = 0.01     # a round trip this short ends a sync's readings: its midpoint is within 5 ms
DRIFT = 5e-4       # how fast this process's monotonic clock may part from Redis's (NTP slews at most 500 ppm)


class Reading(NamedTuple):
    """Redis's time, and this process's monotonic time at the call's midpoint, within `error`."""
    redis_s: float
    monotonic_s: float
    error: float  # half the call's round trip

    def error_at(self, monotonic_s: float) -> float:
        return self.error + DRIFT * abs(monotonic_s - self.monotonic_s)


def read(client: redis.Redis) -> Reading:
    """One `TIME` call, read at its midpoint."""
    before = time.monotonic()
    seconds, micros = client.time()
    after = time.monotonic()
    return Reading(seconds + micros / 1e6, (before + after) / 2, (after - before) / 2)


class RedisClock:
    def __init__(self) -> None:
        self._base: Reading | None = None
        self._lock = threading.Lock()

    def sync(self, client: redis.Redis) -> float:
        """Measure Redis's time again (one `TIME` call, a few where the first met a slow Redis);
        returns it."""
        best = read(client)
        for _ in range(READINGS - 1):
            if best.error <= SHORT_S / 2:
                break
            best = min(best, read(client), key=lambda r: r.error)
        with self._lock:
            base = self._base
            if base is None or best.error <= base.error_at(best.monotonic_s):
                self._base = best
        return self.now()

    def now(self, client: redis.Redis | None = None) -> float:
        """Redis's time, in seconds since the epoch. Needs `client` only before the first sync."""
        return self._estimate(client)[0]

    def error(self, client: redis.Redis | None = None) -> float:
        """How far `now()` may be from Redis's time, at most."""
        return self._estimate(client)[1]

    def earliest(self, client: redis.Redis | None = None) -> float:
        """The earliest Redis's clock can read now: a time another process will compare as "after"."""
        at, error = self._estimate(client)
        return at - error

    def latest(self, client: redis.Redis | None = None) -> float:
        """The latest Redis's clock can read now: a time to compare another's dates with."""
        at, error = self._estimate(client)
        return at + error

    def synced(self) -> bool:
        return self._base is not None

    def _estimate(self, client: redis.Redis | None) -> tuple[float, float]:
        """Redis's time now and its error, both from one base and one monotonic instant (a
        `sync` in another thread between two reads would pair one base's time with another's
        error)."""
        base = self._base
        if base is None:
            if client is None:
                raise RuntimeError("Redis's clock was never read: pass a client")
            self.sync(client)
            base = self._base
        at = time.monotonic()
        return base.redis_s + (at - base.monotonic_s), base.error_at(at)


CLOCK = RedisClock()  # one Redis per process: the producer's, or the worker's broker


def now(client: redis.Redis) -> float:
    """Redis's time: the process's clock, synced with `client` if it never was."""
    return CLOCK.now(client)
