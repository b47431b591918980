"""A health round writes the worker's heartbeat and its sharer stamps in one round trip; the
heartbeat lists each server's share count as of the round before (`workers/intake/health_beat.py`)."""
from __future__ import annotations

from contract.fleet import heartbeats
from contract.keys import SHARERS_PREFIX
from contract.names import ServerState
from workers.intake.health_beat import beat
from workers.servers.bindings import ServerPool

GW, DOWN = "http://gw:30000", "http://down:30000"


def pool_of(*urls: str, up: tuple[str, ...] = ()) -> ServerPool:
    pool = ServerPool(list(urls), max_inflight=1024)
    for binding in pool.bindings:
        if binding.url in up:
            binding.state, binding.preflighted = ServerState.HEALTHY, True
            pool.reset_capacity(binding, 64)
    return pool


def reads(client) -> int:
    """Requests Redis has read from its clients (one read event a round trip of a small pipeline)."""
    return int(client.info("stats")["total_reads_processed"])


def test_the_heartbeat_and_the_sharer_stamps_go_in_one_round_trip(client):
    # Given a worker whose one usable server another worker already shares
    beat(client, "w1", pool_of(GW, up=(GW,)), ttl=20)
    pool = pool_of(GW, DOWN, up=(GW,))
    # When its health round writes
    before = reads(client)
    beat(client, "w2", pool, ttl=20, holding=lambda: {"run": ["p1"]}, started=1.0)
    # Then Redis read one request for it (the second INFO's own is the other)
    assert reads(client) - before == 2
    # and it is stamped on its usable server only, its pool now counts both workers there
    assert {m.decode() for m in client.zrange(SHARERS_PREFIX + GW, 0, -1)} == {"w1", "w2"}
    assert not client.exists(SHARERS_PREFIX + DOWN)
    assert pool.bindings[0].sharers == 2
    # and its heartbeat is written, with what it holds and its own state
    record, = heartbeats.read(client, ["w2"])
    assert record["holding"] == {"run": ["p1"]} and record["started"] == 1.0


def test_the_heartbeat_lists_the_share_count_of_the_round_before(client):
    # Given two workers on one server, the second's first health round done
    beat(client, "w1", pool_of(GW, up=(GW,)), ttl=20)
    pool = pool_of(GW, up=(GW,))
    beat(client, "w2", pool, ttl=20)
    # Then its first heartbeat lists the server's count before that round (alone), its pool the new one
    assert heartbeats.read(client, ["w2"])[0]["servers"][0]["sharers"] == 1 and pool.bindings[0].sharers == 2
    # When its next round writes
    beat(client, "w2", pool, ttl=20)
    # Then the heartbeat lists both workers
    assert heartbeats.read(client, ["w2"])[0]["servers"][0]["sharers"] == 2
