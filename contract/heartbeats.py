"""What a worker tells Redis about itself, for `python -m producer status`.

After each round of health checks the worker writes its servers' state (and
its output storage's: `storage` is `{up, since, last_error, failures}`) under
a key that expires after a few rounds, so a worker that stops writing (dead,
partitioned) drops out of the status on its own. A registry of worker names
(a sorted set by last heartbeat) lets `status` read them without a scan of
the keyspace, so its cost does not grow with the number of keys.
"""
from __future__ import annotations

import json
import os
import socket
import time

import redis

from .keys import WORKER_PREFIX, WORKERS

FORGET_AFTER = 86_400  # seconds: a worker name silent this long leaves the registry


def publish(client: redis.Redis, worker: str, servers: list[dict], ttl: float, **extra) -> None:
    """`servers`: each bound server's snapshot; `extra`: more of the worker's own state."""
    record = {"worker": worker, "host": socket.gethostname(), "pid": os.getpid(),
              "at": time.time(), "servers": servers, **extra}
    with client.pipeline(transaction=False) as pipe:
        pipe.set(WORKER_PREFIX + worker, json.dumps(record), ex=max(1, int(ttl)))
        pipe.zadd(WORKERS, {worker: record["at"]})
        pipe.execute()


def read_all(client: redis.Redis) -> list[dict]:
    """Every worker whose heartbeat has not expired. The registry names them, so this never
    scans the keyspace (which holds 32,768 state buckets per large run); a name not heard
    from for a day leaves it."""
    client.zremrangebyscore(WORKERS, "-inf", time.time() - FORGET_AFTER)
    names = sorted(n.decode() for n in client.zrange(WORKERS, 0, -1))
    raws = client.mget([WORKER_PREFIX + n for n in names]) if names else []
    return [json.loads(raw) for raw in raws if raw]
