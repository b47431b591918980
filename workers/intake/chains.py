"""`enqueue --until-verified K`: a sample that does not pass queues the next sample of its chain.

The chains are `contract/run/samples.py`'s (`successor`): chain j is samples j, j + K,
j + 2K, ... below N. A sample does not pass when it is stored with a verdict
other than a pass (a fail, or a check's `error`) or dead-lettered; its
successor is queued (`contract.broker.publish.publish_samples`: a ledger entry with
the prompt's ids, then its message) *before* the sample settles, at the two
choke points where a sample settles: `generation._store`, before its row is committed,
and `burial.bury`, before its dead letter is stored.

**Each chain moves on exactly once.** Settling first would leave a window
where a settled sample's chain has no successor and nothing would find it (a
done or dead sample's message is acknowledged as finished). Queued first, a
worker that dies before settling the sample leaves it to be delivered again,
and the successor it queued is not queued twice: the ledger's enqueue is
set-if-absent and only a new entry is published. What that order costs: a
sample delivered again that then passes has queued a successor its chain did
not need; a chain never passes N. A successor whose message was lost (the
worker died between the entry and the message) is republished by the audit,
as any queued prompt without a message is.
"""
from __future__ import annotations

import logging

from contract.keys import queue_for
from contract.ledger.ledger import Ledger
from contract.broker.publish import publish_samples
from contract.run.samples import split_sample_key, successor
from contract.run.spec import RunSpec

log = logging.getLogger(__name__)
CALL = "w"  # the enqueue call of a sample a worker queues (`Ledger.enqueue`)


def follow(rt, spec: RunSpec, key: str, prompt_ids: list[int], app=None) -> str | None:
    """Queue the sample after `key` in its chain, unless it ends there; the key queued now (None:
    none, or already queued by an earlier delivery). `app`: the Celery app that publishes (the
    worker's own where not given)."""
    if spec.until_verified is None or not prompt_ids:
        return None
    prompt_id, index = split_sample_key(key, spec.samples)
    following = successor(index, spec.samples, spec.until_verified)
    if following is None:
        return None
    if app is None:
        from celery import current_app as app  # the worker's app (`celery -A workers`), which publishes its tasks
    queue = queue_for(rt.settings.queue_prefix, spec.served_model)
    # the call a queued entry records is its state's value: kept to a byte (a producer's is 8 hex digits)
    published = publish_samples(app, Ledger(rt.redis, spec.name), spec.samples, queue, CALL,
                                [(prompt_id, prompt_ids, [following])])
    if published:
        log.info("sample %s of run %s did not pass: its chain goes on with %s", key, spec.name, published[0])
    return published[0] if published else None
