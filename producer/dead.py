"""Replaying dead letters: back onto the queue, optionally with a larger budget."""
from __future__ import annotations

from typing import Callable

import redis

from contract.codec import b64_to_ids, pack_ids
from contract.deadletters import DeadLetter
from contract.keys import queue_for
from contract.ledger import Ledger
from contract.publish import publish_prompts
from contract.spec import RunSpec


def requeue(client: redis.Redis, app, spec: RunSpec, letters: list[DeadLetter], queue_prefix: str,
            max_new_tokens: int | None = None, on_progress: Callable[[int], None] | None = None) -> int:
    """Put the letters' prompts back in the ledger and on the queue; the letters go."""
    if not letters:
        return 0
    queue = queue_for(queue_prefix, spec.served_model)
    ledger = Ledger(client, spec.name)
    for start in range(0, len(letters), 500):
        chunk = letters[start:start + 500]
        ledger.requeue({d.id: pack_ids(b64_to_ids(d.prompt_b64)) for d in chunk})  # dead -> queued, letters go
        publish_prompts(app, spec.name, queue, [
            (d.id, d.prompt_tokens, max_new_tokens or d.sampling.get("max_new_tokens")) for d in chunk])
        if on_progress:
            on_progress(start + len(chunk))
    return len(letters)
