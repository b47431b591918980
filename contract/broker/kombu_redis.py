"""What the fleet reads of kombu's Redis transport: its keys, a channel's deliveries, and by-tag settlement.

The fleet needs a few things kombu does not expose: the deliveries a channel
still holds (to renew their leases, acknowledge them and hand them back), the
sorted set that scores them, the hash of unacknowledged messages, the
priority sub-lists of a queue (read by the lost-message audit), and a way to
keep a channel's deliveries when the channel closes because its connection was
lost (`detach`). Each is read here and nowhere else; the worker's own kombu
transport (`workers/intake/transport.py`: subclasses of kombu's channel, QoS
and poller, selected with Celery's `broker_transport`) adds the rest. kombu,
Celery and redis-py are pinned exactly (`constraints.txt`), and a worker
refuses to start on any other version (`contract/broker/versions.py`).

Read from kombu 5.7.0: `kombu/transport/redis.py` (`Channel.sep`,
`unacked_key`, `unacked_index_key`, `PRIORITY_STEPS`; `QoS.append` storing
`[message._raw, exchange, routing key]` under the delivery tag in `unacked`
and its lease score in `unacked_index`; `QoS.ack` -> `_remove_from_indices`
(ZREM + HDEL by tag); `QoS.restore_by_tag` (a WATCH transaction, so a tag is
restored at most once); `QoS.restore_visible`, the sweep that restores every
tag scored from 0 up to `now - visibility_timeout`) and
`kombu/transport/virtual/base.py` (`QoS._delivered`, an OrderedDict of
delivery tag -> message; `QoS._dirty`, the tags acked but not yet flushed, the
way kombu lets other threads ack). Delivery tags are global in Redis (uuids in
the `unacked` hash and `unacked_index` set, shared by every channel), so any
client can renew, acknowledge or expire any tag. The tag travels in the
message itself (`properties.delivery_tag`, set when it was published), which
is how a task knows its own (`request.properties`).

A delivery is scored with its worker's lease holder, below 0 and so outside
kombu's sweep, until its worker's lease lapses (`worker_lease.py`); every time
score (a lapsed holder's deliveries re-scored to 0, the sweep's cut-off, a
lease) is read on Redis's clock.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable, Iterable, Iterator


log = logging.getLogger(__name__)
UNACKED = "unacked"               # hash: delivery tag -> JSON [message, exchange, routing key]
UNACKED_INDEX = "unacked_index"   # sorted set: delivery tag -> time fetched (the lease)
PRIORITY_SEP = "\x06\x16"         # `queue + sep + priority` names a priority sub-list
PRIORITY_STEPS = (0, 3, 6, 9)
RESTORE_PAGE = 500                # lapsed leases one restore sweep reads (kombu's `unacked_restore_limit`)
# Celery consumer steps whose Redis traffic grows with the square of the fleet, which the worker
# leaves out (`workers.intake.consumer.FleetConsumer`): gossip has every worker receive every other
# worker's heartbeat event (~360 B/s per pair), mingle asks every worker at each start. Flower
# reads the heartbeat events themselves (the Heart step stays) and `celery inspect` is remote
# control (the Control step stays).
GROWS_WITH_FLEET = ("celery.worker.consumer.gossip:Gossip", "celery.worker.consumer.mingle:Mingle")
WITHOUT_GROWS_WITH_FLEET = ("without_gossip", "without_mingle")  # the options (flags) that turn each off


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold a queue's messages: the plain one and its priority lists."""
    return [queue] + [f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS if p]


def queue_depth(client, queue: str) -> int:
    """Messages waiting in a Celery queue on Redis (every priority sub-list)."""
    with client.pipeline(transaction=False) as pipe:
        for name in queue_lists(queue):
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())


def held(qos) -> dict[str, Any]:
    """Delivery tag -> kombu message, for what a channel's QoS holds and has not acknowledged."""
    for _ in range(3):
        try:
            dirty = set(qos._dirty)
            return {tag: m for tag, m in list(qos._delivered.items()) if tag not in dirty}
        except RuntimeError:  # changed size during iteration (a thread acked): again
            continue
    return {}


def qos_of(channel) -> Any | None:
    """The QoS that holds a channel's deliveries (None before it consumed anything)."""
    return getattr(channel, "_qos", None)


def mark_acked(qos, tag: str) -> None:
    """Tell a QoS a tag is settled, as kombu's own ack does from any thread."""
    qos._dirty.add(tag)


class _Settled:
    """Delivery tags a group commit acknowledged in Redis (`kombu_take.forget`), until kombu's own
    ack of each settles only its channel's memory. Bounded: a tag whose ack never comes (its task
    ended another way meanwhile) is forgotten after `LIMIT` newer ones."""
    LIMIT = 65536

    def __init__(self) -> None:
        self._tags: dict[str, bool] = {}
        self._lock = threading.Lock()

    def add(self, tags: Iterable[str]) -> None:
        with self._lock:
            self._tags.update(dict.fromkeys(tags, True))
            while len(self._tags) > self.LIMIT:
                del self._tags[next(iter(self._tags))]

    def pop(self, tag: str) -> bool:
        with self._lock:
            return self._tags.pop(tag, False)


_SETTLED = _Settled()


def settled_pop(tag: str) -> bool:
    """Whether a group commit acknowledged this tag in Redis already (once: the tag is forgotten)."""
    return _SETTLED.pop(tag)


def settled(tags: Iterable[str]) -> None:
    """These deliveries are acknowledged in Redis already (with their group commit): kombu's ack
    of each, when its task returns, settles only its channel's memory (`workers/intake/transport.py`)."""
    _SETTLED.add(tags)


def renew(client, tags: Iterable[str], at: float) -> None:
    """Re-score leases that still exist (XX: never resurrect an acknowledged tag)."""
    tags = list(tags)
    if tags:
        client.zadd(UNACKED_INDEX, {tag: at for tag in tags}, xx=True)


def ack(client, tags: Iterable[str]) -> None:
    """Acknowledge by tag, as `QoS.ack` -> `_remove_from_indices` does (a tag its group commit
    acknowledged already is left out)."""
    tags = [tag for tag in tags if not _SETTLED.pop(tag)]
    if tags:
        with client.pipeline() as pipe:
            pipe.zrem(UNACKED_INDEX, *tags)
            pipe.hdel(UNACKED, *tags)
            pipe.execute()


def expire(client, tags: Iterable[str]) -> None:
    """Hand deliveries back through kombu's own sweep: a lease scored 0 has run out, so the
    next `restore_visible` of any live worker restores it, once (its WATCH transaction)."""
    renew(client, tags, 0.0)


def restore(channel, tags: Iterable[str]) -> None:
    """Put deliveries back on their queue now, through a live channel's kombu restore."""
    qos = channel.qos
    for tag in tags:
        qos.restore_by_tag(tag)


def detach(channel, on_ack: Callable[[str], None], on_requeue: Callable[[str], None]) -> Any | None:
    """Keep a channel's deliveries when it closes: its QoS (the worker transport's,
    `workers/intake/transport.py`) restores nothing at close (nor when collected), and an ack or
    reject of one of its messages calls `on_ack(tag)` or, for a reject with requeue,
    `on_requeue(tag)`, instead of using the closed channel. Returns the QoS, whose `held`
    deliveries the caller now owns."""
    qos = qos_of(channel)
    if qos is None:
        return None
    qos.detach(on_ack, on_requeue)
    return qos


def queued_messages(client, queue: str, page: int = 200) -> Iterator[dict]:
    """A queue's messages (Celery protocol-2 dicts), a page of LRANGE at a time from the head, so
    no one command grows with the queue. kombu publishes and restores with LPUSH or RPUSH and
    fetches with BRPOP, so no message moves towards the head: one present throughout is read at
    least once (a push at the head may show one twice)."""
    for name in queue_lists(queue):
        start = 0
        while True:
            raws = client.lrange(name, start, start + page - 1)
            for raw in raws:
                yield json.loads(raw)
            if len(raws) < page:
                break
            start += page
