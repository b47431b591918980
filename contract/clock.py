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
"""
from __future__ import annotations

import threading
import time

import redis


class RedisClock:
    def __init__(self) -> None:
        self._base: tuple[float, float] | None = None  # (Redis seconds, monotonic seconds) at one instant
        self._lock = threading.Lock()

    def sync(self, client: redis.Redis) -> float:
        """Measure Redis's time now (one `TIME`); returns it."""
        before = time.monotonic()
        seconds, micros = client.time()
        after = time.monotonic()
        with self._lock:
            self._base = (seconds + micros / 1e6, (before + after) / 2)
        return self.now()

    def now(self, client: redis.Redis | None = None) -> float:
        """Redis's time, in seconds since the epoch. Needs `client` only before the first sync."""
        base = self._base
        if base is None:
            if client is None:
                raise RuntimeError("Redis's clock was never read: pass a client")
            return self.sync(client)
        return base[0] + (time.monotonic() - base[1])

    def synced(self) -> bool:
        return self._base is not None


CLOCK = RedisClock()  # one Redis per process: the producer's, or the worker's broker


def now(client: redis.Redis) -> float:
    """Redis's time: the process's clock, synced with `client` if it never was."""
    return CLOCK.now(client)
