"""The worker's Redis connections: a few, whatever its threads and servers.

A worker talks to Redis on three kinds of connection: kombu's blocking fetch
(BRPOP, one, held by design), its remote-control subscription (`celery
inspect`, one), and every short call, its own and kombu's (the ledger's
scripts, leases, heartbeats, kombu's record of each delivery and its
acknowledgement, task events). The short calls all share one client whose
blocking pool holds `FLEET_REDIS_CONNECTIONS` connections (default 2): a task
thread waits for a free one rather than opening another, so a worker holds
at most 5 connections in steady state however many threads and servers it
has (the fifth: the lease keeper's own, below), and Redis's `maxclients` (10,000 by default) is not what limits the
fleet (measured: 10 to 15 per worker before, gossip off). kombu's own short
calls reach it through the worker's kombu transport (`transport.py`). The client retries a call
through an outage, except one its event loop makes (`contract/redis_link/retries.py`:
the consumer's thread fails fast, on the same connections).

One thread never waits for the shared pool: the lease keeper (`lease.py`). Its
rounds are what keep the worker's prompts its own, and task threads can hold
the shared connections for seconds at a time while a failover is settled
(each turn of `contract/redis_link/replication.confirm` holds one for a `WAIT`
of up to a second, again and again, up to `ALONE_AFTER`), and redis-py's
blocking pool is not fair: measured with a real redis-server, a thread pinging
once a second waited 15 s behind 2 threads in such a loop and 30 s behind 30.
A lease that lapses that way hands a live worker's prompts to another worker,
which generates them a second time. So the keeper has a client of its own,
one connection no other thread takes (`lease_redis`).

A small pool asks one thing of its callers: none holds a connection while it
waits for another (two such threads would wait on each other until the pool's
timeout). A pipeline holds its connection only while it executes; kombu's
restore transaction (WATCH) would ask for a second one only for a message
published to a named exchange, and the fleet publishes to the default one.
"""
from __future__ import annotations

from functools import lru_cache

import redis

from contract.redis_link import retries
from contract.redis_link.connections import client_for, redis_for

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


@lru_cache(maxsize=4)
def lease_redis(url: str) -> redis.Redis:
    """The lease keeper's client for `url`: a pool of one connection, its own (module docstring),
    with the shared client's retries through an outage."""
    return client_for(url, retry=retries.shared(), max_connections=1)
