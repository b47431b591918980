"""Replaying dead letters: back onto the queue, optionally with a larger budget, a page at a time."""
from __future__ import annotations

from typing import Callable

import redis

from contract.ledger.codec import b64_to_ids, pack_ids
from contract.ledger.deadletters import DeadLetter
from contract.keys import queue_for
from contract.ledger.ledger import Ledger
from contract.broker.publish import publish_prompts
from contract.run.spec import RunSpec


def replayable(letter: DeadLetter) -> bool:
    """A letter written because Redis had forgotten its prompt holds no token ids: replaying
    it would publish an empty prompt, so it stays a dead letter (its line must be enqueued again)."""
    return letter.prompt_tokens > 0 and bool(letter.prompt_b64)


def requeue(client: redis.Redis, app, spec: RunSpec, letters: list[DeadLetter], queue_prefix: str,
            max_new_tokens: int | None = None, on_progress: Callable[[int], None] | None = None) -> int:
    """Put the letters' prompts back in the ledger and on the queue; the letters go. Only the
    prompts the ledger moved from dead to queued are published, so a letter met twice (a
    scan may return one twice) or replayed meanwhile by someone else is published once.
    Letters without token ids (`replayable`) are left where they are."""
    letters = [d for d in letters if replayable(d)]
    if not letters:
        return 0
    queue = queue_for(queue_prefix, spec.served_model)
    ledger = Ledger(client, spec.name)
    published = 0
    for start in range(0, len(letters), 500):
        chunk = letters[start:start + 500]
        budgets = {d.key: max_new_tokens or d.sampling.get("max_new_tokens") for d in chunk}
        moved = set(ledger.requeue({d.key: pack_ids(b64_to_ids(d.prompt_b64)) for d in chunk}, budgets=budgets))
        publish_prompts(app, spec.name, queue, [  # a sample's letter goes back as that sample (its key)
            (d.key, d.prompt_tokens, budgets[d.key]) for d in chunk if d.key in moved])
        published += len(moved)
        if on_progress:
            on_progress(start + len(chunk))
    return published
