"""Redis's clock as a worker reads it: within a stated error, even when the reading met an outage.

A worker dates its heartbeats on Redis's clock, and another compares those
dates with its own reading (`workers/intake/deliveries.elsewhere`). The lease
round syncs the clock through the fleet's retrying client, so a sync can meet
a frozen primary or wait out a failover; such a reading, taken at face value,
set the clock seconds ahead (half the outage or more).
"""
from __future__ import annotations

import signal
import threading
import time

from contract.redis_link.clock import RedisClock, read
from contract.redis_link.connections import redis_for
from producer.local import start_redis


def _skew(clock: RedisClock, client) -> tuple[float, float]:
    """How far the clock is from Redis's time now, and how far a fresh reading allows that to be."""
    reading = read(client)
    at_reading = clock.now() - (time.monotonic() - reading.monotonic_s)
    return abs(at_reading - reading.redis_s), clock.error() + reading.error + 0.002


def _sync_during(clock: RedisClock, client, outage) -> None:
    """Sync `clock` on a thread while `outage` runs (it ends the outage before it returns)."""
    thread = threading.Thread(target=clock.sync, args=(client,))
    thread.start()
    outage()
    thread.join(60)
    assert not thread.is_alive()


def test_a_sync_that_meets_a_frozen_redis_leaves_the_clock_within_its_error(tmp_path):
    # Given a clock synced with Redis through the fleet's retrying client
    process, url = start_redis(tmp_path)
    client, clock = redis_for(url), RedisClock()
    try:
        clock.sync(client)
        # When Redis freezes for 2 s (SIGSTOP) while the clock syncs again
        process.signal(signal.SIGSTOP)

        def thaw() -> None:
            time.sleep(2)
            process.signal(signal.SIGCONT)
        _sync_during(clock, client, thaw)

        # Then the clock reads Redis's time within its stated error, and that error is milliseconds
        skew, allowed = _skew(clock, client)
        assert skew <= allowed, f"the clock is {skew:.3f}s off Redis's time (allowed {allowed:.3f}s)"
        assert clock.error() < 0.05
    finally:
        process.signal(signal.SIGCONT)
        process.stop()


def test_a_sync_that_waits_out_a_redis_restart_leaves_the_clock_within_its_error(tmp_path):
    # Given a clock synced with Redis through the fleet's retrying client
    process, url = start_redis(tmp_path / "first")
    port = redis_for(url).connection_pool.connection_kwargs["port"]
    client, clock = redis_for(url), RedisClock()
    clock.sync(client)
    process.kill()
    restarted = []

    def restart() -> None:  # down 2 s, then up on the same port: the sync's retries wait it out
        time.sleep(2)
        restarted.append(start_redis(tmp_path / "second", port=port)[0])

    try:
        # When the clock syncs again while Redis is down
        _sync_during(clock, client, restart)

        # Then the clock reads Redis's time within its stated error, and that error is milliseconds
        skew, allowed = _skew(clock, client)
        assert skew <= allowed, f"the clock is {skew:.3f}s off Redis's time (allowed {allowed:.3f}s)"
        assert clock.error() < 0.05
    finally:
        for p in restarted:
            p.stop()


def test_the_earliest_and_latest_readings_bound_redis_time(client):
    clock = RedisClock()
    clock.sync(client)
    seconds, micros = client.time()
    truth = seconds + micros / 1e6
    assert clock.earliest() <= truth + 0.002 and clock.latest() >= truth - 0.002
    assert 0 <= clock.latest() - clock.earliest() < 0.05
