"""What a worker tells Redis about itself, for `python -m producer status`.

After each round of health checks the worker writes its servers' state (and
its output storage's: `storage` is `{up, since, last_error, failures}`) under
a key that expires after a few rounds, so a worker that stops writing (dead,
partitioned) drops out of the status on its own.
"""
from __future__ import annotations

import json
import os
import socket
import time

import redis

from .keys import WORKER_PREFIX


def publish(client: redis.Redis, worker: str, servers: list[dict], ttl: float, **extra) -> None:
    """`servers`: each bound server's snapshot; `extra`: more of the worker's own state."""
    record = {"worker": worker, "host": socket.gethostname(), "pid": os.getpid(),
              "at": time.time(), "servers": servers, **extra}
    client.set(WORKER_PREFIX + worker, json.dumps(record), ex=max(1, int(ttl)))


def read_all(client: redis.Redis) -> list[dict]:
    keys = sorted(client.scan_iter(match=WORKER_PREFIX + "*", count=500))
    return [json.loads(raw) for raw in client.mget(keys) if raw] if keys else []
