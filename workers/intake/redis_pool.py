"""The worker's Redis connections: a few, whatever its threads and servers.

A worker talks to Redis on three kinds of connection: kombu's blocking fetch
(BRPOP, one, held by design), its remote-control subscription (`celery
inspect`, one), and every short call, its own and kombu's (the ledger's
scripts, leases, heartbeats, kombu's record of each delivery and its
acknowledgement, task events). The short calls all share one client whose
blocking pool holds `FLEET_REDIS_CONNECTIONS` connections (default 2): a task
thread waits for a free one rather than opening another, so a worker holds
at most 4 connections in steady state however many threads and servers it
has, and Redis's `maxclients` (10,000 by default) is not what limits the
fleet (measured: 10 to 15 per worker before, gossip off). kombu's own short
calls reach it through the worker's kombu transport (`transport.py`). The client retries a call
through an outage, except one its event loop makes (`contract/redis_link/retries.py`:
the consumer's thread fails fast, on the same connections).

A small pool asks one thing of its callers: none holds a connection while it
waits for another (two such threads would wait on each other until the pool's
timeout). A pipeline holds its connection only while it executes; kombu's
restore transaction (WATCH) would ask for a second one only for a message
published to a named exchange, and the fleet publishes to the default one.
"""
from __future__ import annotations

import redis

from contract.redis_link.connections import redis_for

DEFAULT_CONNECTIONS = 2
_connections = DEFAULT_CONNECTIONS
_url: str | None = None


def configure(connections: int, url: str | None = None) -> None:
    """Set the shared pool's size, once, at the worker's entry point (before any client is built),
    and the Redis every channel of the worker's transport shares it for (`transport.py`)."""
    global _connections, _url
    _connections = max(1, int(connections))
    _url = url


def shared() -> redis.Redis | None:
    """The worker's client for the Redis `configure` named (None where none was named: a process
    that is not a worker keeps kombu's own clients)."""
    return worker_redis(_url) if _url is not None else None


def worker_redis(url: str) -> redis.Redis:
    """The worker's one client for `url`: every caller in the process shares its pool."""
    return redis_for(url, _connections)
