"""A cut broker connection is not a crash: prompts in flight stay with the worker that runs them.

What kombu 5.7.0 / Celery 5.7.0 do when a worker's connection to Redis drops
(a Redis restart, a network reset, `CLIENT KILL`, a failover): the event loop
raises, and Celery's `Consumer.on_connection_error_after_connected` calls
`connection.collect()`, which closes every channel of the connection. kombu's
`Channel.close` -> `QoS.restore_unacked_once` -> `restore_unacked` pushes every
delivery the channel still holds back on its queue, although the threads pool
keeps running those tasks (Celery does not cancel them by default). Another
worker, or this one once reconnected, then starts the same prompts again: seen,
16 of 16 generations in flight ran twice. When Redis is down instead, the
restore fails half-way, the rest stays in `unacked` with a lease nobody renews
(the lease keeper looked only at the new channel), and the sweep hands those
to another worker one lease later: the same duplicate, later.

The design here: before Celery collects the connection, the task consumer's
channel is *detached* (`kombu_redis.detach`): its QoS restores nothing when the
channel closes, and the acks and rejects its tasks send later go through the
worker's own Redis client instead of the dead channel (`Detached.ack`: ZREM +
HDEL by delivery tag, as kombu's `QoS.ack` does; a reject with requeue expires
the lease, so kombu's own sweep restores it exactly once). Delivery tags are
global in Redis, so this works from any connection, across any number of
reconnects. The lease keeper renews the leases of every detached QoS's held
deliveries as well as the current channel's (`held_deliveries`), and settles
the ones whose prompt the ledger already records as finished (an ack that was
lost with the connection). So while this worker runs a generation, its lease
is renewed and no one else starts it; when this worker dies, the lease runs
out and the prompt comes back within one lease, as before. A message lost on
the wire while being fetched is not this module's: the audit republishes it.

The consumer's thread is the event loop's, and its Redis calls fail fast
(`contract/redis_link/retries.py`): kombu's short calls on it share the worker's client,
whose retries would otherwise hold the loop for minutes of a Redis outage, so
that the loss reached this hook (and the worker reconnected) only then.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from celery.worker.consumer import Consumer

from contract.broker import kombu_redis
from contract.redis_link import retries
from contract.counts import counted

from ..reporting import heart
from .recent import ACKED
from .runtime import get_runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """A message this worker holds and has not acknowledged, and the prompt it carries."""
    tag: str
    qos: Any
    run: str | None
    prompt_id: str | None


class Detached:
    """The QoS of every channel closed under running tasks, until their deliveries are settled."""

    def __init__(self) -> None:
        self._qos: list[Any] = []
        self._lock = threading.Lock()
        self.client = None

    def adopt(self, channel, client) -> int:
        """Keep the channel's deliveries with this worker; returns how many are kept in all."""
        self.client = client
        qos = kombu_redis.detach(channel, self.ack, self.requeue)
        if qos is not None:
            with self._lock:
                if all(q is not qos for q in self._qos):
                    self._qos.append(qos)
        return sum(len(kombu_redis.held(q)) for q in self.qos_list())

    def ack(self, tag: str) -> None:
        kombu_redis.ack(self.client, [tag])
        ACKED.add(tag)  # sent again on a new primary after a failover (`workers/intake/failover.py`)

    def requeue(self, tag: str) -> None:
        kombu_redis.expire(self.client, [tag])

    def qos_list(self) -> list[Any]:
        """The detached QoS still holding something (the others are let go)."""
        with self._lock:
            self._qos = [q for q in self._qos if kombu_redis.held(q)]
            return list(self._qos)


DETACHED = Detached()


# Seconds between the worker-heartbeat events Flower reads (Celery's default: 2): each is a PUBLISH
# (one a node every 2 s is ~0.07 Redis cores at 5,000 nodes); Flower reads the interval from the
# event and counts a worker offline after two missed. `--heartbeat-interval` on the command line wins.
HEART_INTERVAL = 10.0


class FleetConsumer(Consumer):
    class Blueprint(Consumer.Blueprint):
        """Celery's consumer steps, its heartbeat step the fleet's (`workers/reporting/heart.py`:
        heartbeats sent without kombu's retry loop, which held the event loop through an outage)."""
        default_steps = [heart.STEP if step == heart.CELERY_STEP else step
                         for step in Consumer.Blueprint.default_steps]

    def __init__(self, *args, worker_options=None, **kwargs):
        """Gossip and mingle off whatever the command line says (`kombu_redis.GROWS_WITH_FLEET`): a plain
        `celery -A workers worker` runs neither, as `--without-gossip --without-mingle` would have it."""
        options = {**(worker_options or {}), **dict.fromkeys(kombu_redis.WITHOUT_GROWS_WITH_FLEET, True)}
        options["heartbeat_interval"] = options.get("heartbeat_interval") or HEART_INTERVAL
        super().__init__(*args, worker_options=options, **kwargs)

    def start(self):
        """The event loop, and every reconnect: each Redis call of this thread fails fast."""
        with retries.failing_fast():
            return super().start()

    def on_send_event_buffered(self) -> None:
        """Celery asks its event loop to flush after every buffered task event; the loop's
        timer flushes them in batches instead (`events.BatchedEvents`)."""

    def on_connection_error_after_connected(self, exc):
        consumer = self.task_consumer
        if consumer is not None and consumer.channel is not None:
            rt = get_runtime(self.app.fleet_settings, self.hostname)
            kept = DETACHED.adopt(consumer.channel, rt.redis)
            log.warning("broker connection lost (%r): %s in flight kept by this worker, leased and "
                        "acknowledged through its own Redis client", exc, counted(kept, "prompt"))
        super().on_connection_error_after_connected(exc)


def held_deliveries(c) -> dict[str, Delivery]:
    """Every delivery this worker holds: the current task channel's and every detached one's."""
    sources = list(DETACHED.qos_list())
    consumer = c.task_consumer
    current = kombu_redis.qos_of(consumer.channel) if consumer is not None and consumer.channel else None
    if current is not None and all(q is not current for q in sources):
        sources.append(current)
    held: dict[str, Delivery] = {}
    for qos in sources:
        for tag, message in kombu_redis.held(qos).items():
            run, prompt_id = prompt_of(message)
            held[tag] = Delivery(tag, qos, run, prompt_id)
    return held


def current_channel(c):
    """The task consumer's channel, while it is connected; None during a reconnect."""
    consumer = c.task_consumer
    channel = consumer.channel if consumer is not None else None
    if channel is None or getattr(channel, "closed", True) or getattr(channel, "connection", None) is None:
        return None
    return channel


def prompt_of(message) -> tuple[str | None, str | None]:
    """(run, prompt id) from a fleet message: a Celery protocol-2 body `[args, kwargs, embed]`
    whose args start with the run and the prompt id (`contract.broker.publish`)."""
    try:
        args = json.loads(message.body)[0]
        return str(args[0]), str(args[1])
    except (TypeError, ValueError, IndexError, KeyError, AttributeError):
        return None, None
