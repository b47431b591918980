"""Replaying dead letters: back onto the queue, optionally with a larger budget."""
from __future__ import annotations

import redis

from workers.deadletter import DeadLetter, DeadLetters
from workers.ledger import Ledger
from workers.payload import unpack_ids
from workers.runs import RunSpec, queue_for

from .enqueue import publish_prompts


def requeue(client: redis.Redis, app, spec: RunSpec, letters: list[DeadLetter], queue_prefix: str,
            max_new_tokens: int | None = None) -> int:
    """Publish the letters' prompts again, then take them off the dead-letter queue."""
    if not letters:
        return 0
    queue = queue_for(queue_prefix, spec.served_model)
    batch = [(d.id, unpack_ids(d.prompt_b64), max_new_tokens or d.sampling.get("max_new_tokens"))
             for d in letters]
    for start in range(0, len(batch), 500):
        publish_prompts(app, spec.name, queue, batch[start:start + 500])
    ids = [d.id for d in letters]
    with client.pipeline() as pipe:
        Ledger(client, spec.name).mark_queued(pipe, ids, 0)
        pipe.hdel(DeadLetters(client, spec.name).keys.dead, *ids)
        pipe.execute()
    return len(ids)
