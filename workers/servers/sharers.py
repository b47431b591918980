"""How many live workers are bound to each of this worker's servers, counted in Redis.

A server's in-flight tuner starts at its share of the server (`workers/servers/capacity.py`:
capacity + headroom over the sharers), so workers that start together do not each
send a whole batch and build a queue several batches long. Each health round, in
the pipeline of its heartbeat (one round trip), a worker stamps itself (Redis's
clock: nodes' clocks may disagree) into one sorted set per usable server URL (`SHARERS_PREFIX` + the
redacted URL, as every worker holds it), drops the stamps older than a heartbeat's
life, and counts the rest. O(log n) per server and round whatever the fleet's
size, and no scan of the heartbeats. Workers bound to one server under different
URLs (a name and an address) count apart: they are then each other's "other
clients", which the share rule still handles once the load shows them.
"""
from __future__ import annotations

from typing import Callable

import redis
from redis.client import Pipeline

from contract.keys import SHARERS_PREFIX


def stamp(pipe: Pipeline, worker: str, urls: list[str], ttl: float, now: float) -> Callable[[list], dict[str, int]]:
    """Stamp `worker` on each server of `urls` at `now` (Redis's clock), queued on `pipe` (the
    health round sends it with its heartbeat: `workers/intake/health_beat.py`); returns what reads,
    from that pipeline's replies, the live workers on each server, `worker` included."""
    start = len(pipe)
    for url in urls:
        key = SHARERS_PREFIX + url
        pipe.zadd(key, {worker: now})
        pipe.zremrangebyscore(key, "-inf", now - ttl)
        pipe.zcard(key)
        pipe.expire(key, max(1, int(ttl)))
    return lambda replies: {url: max(1, int(replies[start + 4 * i + 2])) for i, url in enumerate(urls)}


def leave(client: redis.Redis, worker: str, urls: list[str]) -> None:
    """A worker that stops: its stamps go, so a restarted fleet counts only the living."""
    with client.pipeline(transaction=False) as pipe:
        for url in urls:
            pipe.zrem(SHARERS_PREFIX + url, worker)
        pipe.execute()
