"""The one door to kombu's Redis transport internals.

The fleet needs a few things kombu does not expose: the deliveries a channel
still holds (to renew their leases and hand them back), the sorted set that
scores them, the hash of unacknowledged messages (for the lost-message audit),
the priority sub-lists of a queue, and the transport behind a connection
(to keep late acks working across a broker reconnect). Each is read here and
nowhere else, with the kombu version it was read from; `check()` fails loudly
when an upgrade moves one of them (`tests/specs/test_kombu_redis.py` calls it).

Read from kombu 5.7.0: `kombu/transport/redis.py` (`Channel.sep`,
`unacked_key`, `unacked_index_key`, `PRIORITY_STEPS`, `QoS.restore_unacked`,
`QoS.append` storing `[message._raw, exchange, routing_key]`) and
`kombu/transport/virtual/base.py` (`QoS._delivered`, an OrderedDict of
delivery tag -> message; `QoS._dirty`, the tags acked but not yet flushed).
"""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Iterator

READ_FROM = "5.7.0"
UNACKED = "unacked"               # hash: delivery tag -> JSON [message, exchange, routing key]
UNACKED_INDEX = "unacked_index"   # sorted set: delivery tag -> time fetched (the lease)
PRIORITY_SEP = "\x06\x16"         # `queue + sep + priority` names a priority sub-list
PRIORITY_STEPS = (0, 3, 6, 9)


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold a queue's messages: the plain one and its priority lists."""
    return [queue] + [f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS if p]


def queue_depth(client, queue: str) -> int:
    """Messages waiting in a Celery queue on Redis (every priority sub-list)."""
    with client.pipeline(transaction=False) as pipe:
        for name in queue_lists(queue):
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())


def held_tags(channel) -> list[str]:
    """Delivery tags the channel holds and has not acknowledged."""
    qos = channel.qos
    for _ in range(3):
        try:
            return [tag for tag in list(qos._delivered) if tag not in qos._dirty]
        except RuntimeError:  # changed size during iteration (a task thread acked): again
            continue
    return []


def held_count(channel) -> int:
    qos = channel.qos
    return len(qos._delivered) - len(qos._dirty)


def index_key(channel) -> str:
    """The sorted set whose scores are the leases of this channel's deliveries."""
    return channel.unacked_index_key


def restore_held(channel) -> None:
    """Put every delivery the channel holds back on its queue (kombu's own restore)."""
    channel.qos.restore_unacked()


def transport_of(connection) -> Any:
    """The transport object behind a kombu connection, if one was made."""
    return getattr(connection, "_transport", None)


def reattach(transport, connection) -> None:
    """Let channels of a dropped transport still build Redis clients (for late acks)."""
    if transport is not None and getattr(transport, "client", None) is None:
        transport.client = connection


def unacked_messages(client) -> Iterator[dict]:
    """The messages every worker holds, as Celery protocol-2 dicts (headers, body, ...)."""
    for raw in client.hvals(UNACKED):
        yield json.loads(raw)[0]


def queued_messages(client, queue: str) -> Iterator[dict]:
    for name in queue_lists(queue):
        for raw in client.lrange(name, 0, -1):
            yield json.loads(raw)


def check() -> list[str]:
    """What of the above this kombu no longer has; empty when every door still opens."""
    from kombu.transport import redis as kredis
    from kombu.transport.virtual import base

    problems = []
    channel = kredis.Channel
    for name, expected in (("sep", PRIORITY_SEP), ("unacked_key", UNACKED),
                           ("unacked_index_key", UNACKED_INDEX)):
        if getattr(channel, name, None) != expected:
            problems.append(f"kombu.transport.redis.Channel.{name} is {getattr(channel, name, None)!r}, "
                            f"not {expected!r}")
    if tuple(getattr(kredis, "PRIORITY_STEPS", ())) != PRIORITY_STEPS:
        problems.append(f"kombu.transport.redis.PRIORITY_STEPS is {getattr(kredis, 'PRIORITY_STEPS', None)!r}")
    if not callable(getattr(kredis.QoS, "restore_unacked", None)):
        problems.append("kombu.transport.redis.QoS.restore_unacked is gone")
    qos = base.QoS(channel=SimpleNamespace(do_restore=False), prefetch_count=1)
    for name in ("_delivered", "_dirty"):
        if not hasattr(qos, name):
            problems.append(f"kombu.transport.virtual.base.QoS has no {name}")
    return problems
