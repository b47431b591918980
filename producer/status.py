"""Where a run stands, read from Redis: what the `status` command prints."""
from __future__ import annotations

import redis

from workers.deadletter import DeadLetters
from workers.ledger import Ledger
from workers.runs import DEAD, DONE, QUEUED, RunSpec, queue_for


def queue_depth(client: redis.Redis, queue: str) -> int:
    """Messages waiting in a Celery queue on Redis (all priority sub-lists)."""
    return sum(int(client.llen(name)) for name in
               [queue] + [f"{queue}\x06\x16{p}" for p in (1, 2, 3, 4, 5, 6, 7, 8, 9)])


def collect_status(client: redis.Redis, spec: RunSpec, queue_prefix: str) -> dict:
    states = Ledger(client, spec.name).counts()
    counters = Ledger(client, spec.name).counters()
    queue = queue_for(queue_prefix, spec.served_model)
    done, dead, pending = states.get(DONE, 0), states.get(DEAD, 0), states.get(QUEUED, 0)
    waiting = queue_depth(client, queue)
    return {
        "run": spec.name,
        "queue": queue,
        "prompts": done + dead + pending,
        "queued": waiting,
        "in_flight": max(pending - waiting, 0),
        "pending": pending,
        "done": done,
        "dead": dead,
        "dead_by_reason": DeadLetters(client, spec.name).stats(),
        "prompt_tokens": counters.get("prompt_tokens", 0),
        "output_tokens": counters.get("output_tokens", 0),
        "finished": pending == 0,
    }
