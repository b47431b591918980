"""What a worker tells Redis about itself, for `python -m producer status`.

After each round of health checks the worker writes its servers' state (and
its output storage's: `storage` is `{up, since, last_error, failures}`) under
a key that expires after a few rounds, so a worker that stops writing (dead,
partitioned) drops out of the status on its own. A registry of worker names
(a sorted set by last heartbeat) lets `status` read them without a scan of
the keyspace, so its cost does not grow with the number of keys.

A heartbeat also lists the prompts its worker holds (`holding`: run -> ids),
which the lost-message audit counts as held and a second delivery of one of
them finds (`workers/intake/deliveries.py`). Its time `at` is Redis's clock
(`contract/redis_link/clock.py`: the earliest it can read, within the clock's error), read
before the list is taken, so a heartbeat newer than the latest another
process's clock read at a moment lists every prompt its worker had begun
taking by then; whoever ages a heartbeat reads Redis's clock too.

`cache_hits` is the worker's prefix-cache tally of its last minutes, per server
(`contract/fleet/cache_hits.py`: sums, so `status` adds those of all workers).
"""
from __future__ import annotations

import json
import os
import socket
from typing import Callable

import redis
from redis.client import Pipeline

from contract.redis_link.clock import CLOCK
from contract.keys import WORKER_PREFIX, WORKERS

FORGET_AFTER = 86_400  # seconds: a worker name silent this long leaves the registry


def publish(client: redis.Redis, worker: str, servers: list[dict], ttl: float,
            holding: Callable[[], dict[str, list[str]]] | None = None, pipe: Pipeline | None = None,
            **extra) -> None:
    """`servers`: each bound server's snapshot; `holding`: the prompts the worker holds, read
    after the heartbeat's time; `extra`: more of the worker's own state. With `pipe`, the
    heartbeat is queued there, sent when its owner executes it (one round trip with the rest)."""
    at = CLOCK.earliest(client)  # compared as "after" by another process: never later than it is
    record = {"worker": worker, "host": socket.gethostname(), "pid": os.getpid(),
              "at": at, "servers": servers, "holding": holding() if holding else {}, **extra}
    if pipe is not None:
        _queue(pipe, worker, record, ttl)
        return
    with client.pipeline(transaction=False) as own:
        _queue(own, worker, record, ttl)
        own.execute()


def _queue(pipe: Pipeline, worker: str, record: dict, ttl: float) -> None:
    pipe.set(WORKER_PREFIX + worker, json.dumps(record), ex=max(1, int(ttl)))
    pipe.zadd(WORKERS, {worker: record["at"]})


def read_all(client: redis.Redis) -> list[dict]:
    """Every worker whose heartbeat has not expired. The registry names them, so this never
    scans the keyspace (which holds 32,768 state buckets per large run); a name not heard
    from for a day leaves it."""
    client.zremrangebyscore(WORKERS, "-inf", CLOCK.now(client) - FORGET_AFTER)
    names = sorted(n.decode() for n in client.zrange(WORKERS, 0, -1))
    return [r for r in read(client, names) if r is not None]


def read(client: redis.Redis, names: list[str], page: int = 50) -> list[dict | None]:
    """Each named worker's heartbeat, None where it has expired (one MGET per `page` of them: a
    heartbeat lists the prompts its worker holds, so no one call grows with the fleet)."""
    raws = []
    for start in range(0, len(names), page):
        raws += client.mget([WORKER_PREFIX + n for n in names[start:start + page]])
    return [json.loads(raw) if raw else None for raw in raws]


def last_seen(client: redis.Redis, names: list[str], page: int = 500) -> list[float | None]:
    """Each named worker's last heartbeat time (the registry's score), None if never heard of
    (one ZMSCORE per `page` of them)."""
    scores = []
    for start in range(0, len(names), page):
        scores += client.zmscore(WORKERS, names[start:start + page])
    return [float(s) if s is not None else None for s in scores]


def held(client: redis.Redis) -> dict[str, set[str]]:
    """Run -> the prompts that live workers list as held."""
    found: dict[str, set[str]] = {}
    for record in read_all(client):
        for run, prompt_ids in (record.get("holding") or {}).items():
            found.setdefault(run, set()).update(prompt_ids)
    return found
