"""The one door to kombu's Redis transport internals, and the check of every kombu and Celery internal.

The fleet needs a few things kombu does not expose: the deliveries a channel
still holds (to renew their leases, acknowledge them and hand them back), the
sorted set that scores them, the hash of unacknowledged messages (for the
lost-message audit), the priority sub-lists of a queue, and a way to keep a
channel's deliveries when the channel closes because its connection was lost
(`detach`). Each is read here and nowhere else, with the kombu version it was
read from. `check()` lists what an upgrade moved, of these and of the Celery
internals the worker relies on elsewhere (its consumer's hooks and steps, the
event dispatcher's buffers, `as_task_v2`); the worker refuses to start on such
an install (`require()`, naming the installed versions), and pyproject.toml
bounds celery, kombu and redis-py below their next minor versions.

Read from kombu 5.7.0: `kombu/transport/redis.py` (`Channel.sep`,
`unacked_key`, `unacked_index_key`, `PRIORITY_STEPS`; `QoS.append` storing
`[message._raw, exchange, routing key]` under the delivery tag in `unacked`
and the fetch time in `unacked_index`; `QoS.ack` -> `_remove_from_indices`
(ZREM + HDEL by tag); `QoS.restore_by_tag` (a WATCH transaction, so a tag is
restored at most once); `QoS.restore_visible`, the sweep that restores every
tag scored older than `visibility_timeout`) and
`Channel._create_client(asynchronous=False)`, which `conn_or_acquire` calls
for every QoS append, ack and fanout publish, building a new client object) and
`kombu/transport/virtual/base.py` (`QoS._delivered`, an OrderedDict of
delivery tag -> message; `QoS._dirty`, the tags acked but not yet flushed, the
way kombu lets other threads ack; `Channel.close` -> `QoS.restore_unacked_once`
-> `restore_unacked`, guarded by `restore_at_shutdown`). `SentinelChannel`
(`sentinel://`) subclasses that `Channel` and overrides only how its pool is
found (`_sentinel_managed_pool`, which `follow_sentinel_pools` wraps to list
the pools), so all of the above holds for it too. Delivery tags are
global in Redis (uuids in the `unacked` hash and `unacked_index` set, shared
by every channel), so any client can renew, acknowledge or expire any tag.

Lease scores are times: `QoS.append` scores a delivery with the module's
`time()` and `QoS.restore_visible` restores what scores older than `time() -
visibility_timeout`, each on the clock of the worker that runs it. Workers
whose clocks disagree would restore each other's fresh deliveries (or keep a
dead worker's for as long as its clock ran ahead), so `use_clock` points that
`time` at Redis's clock (`contract/clock.py`), and the lease keeper renews on
it too: every score is written and compared on one clock.
"""
from __future__ import annotations

import json
import weakref
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

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


def renew(client, tags: Iterable[str], at: float) -> None:
    """Re-score leases that still exist (XX: never resurrect an acknowledged tag)."""
    tags = list(tags)
    if tags:
        client.zadd(UNACKED_INDEX, {tag: at for tag in tags}, xx=True)


def ack(client, tags: Iterable[str]) -> None:
    """Acknowledge by tag, as `QoS.ack` -> `_remove_from_indices` does."""
    tags = list(tags)
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
    """Keep a channel's deliveries when it closes: its QoS restores nothing at close (nor when
    collected), and an ack or reject of one of its messages calls `on_ack(tag)` or, for a
    reject with requeue, `on_requeue(tag)`, instead of using the closed channel. Returns the
    QoS, whose `held` deliveries the caller now owns."""
    qos = qos_of(channel)
    if qos is None:
        return None
    if not hasattr(qos, "fleet_on_ack"):  # detached once is enough
        qos.__class__ = _detached_class(type(qos))
    qos.fleet_on_ack, qos.fleet_on_requeue = on_ack, on_requeue
    return qos


@lru_cache(maxsize=4)
def _detached_class(base: type) -> type:
    class DetachedQoS(base):
        """A closed channel's QoS whose deliveries a live worker still runs."""
        restore_at_shutdown = False

        def ack(self, delivery_tag):
            self.fleet_on_ack(delivery_tag)
            self._dirty.add(delivery_tag)

        def reject(self, delivery_tag, requeue=False):
            (self.fleet_on_requeue if requeue else self.fleet_on_ack)(delivery_tag)
            self._dirty.add(delivery_tag)

        def restore_unacked(self, client=None):
            return []

        def restore_unacked_once(self, stderr=None):
            self._on_collect.cancel()

        def restore_visible(self, *args, **kwargs):
            return None

    DetachedQoS.__name__ = f"Detached{base.__name__}"
    return DetachedQoS


def use_clock(clock: Callable[[], float]) -> None:
    """kombu's lease scores and its restore sweep's cut-off on `clock` (Redis's) instead of
    this machine's wall clock: the two places kombu reads the time (`QoS.append`,
    `QoS.restore_visible`) read `kombu.transport.redis.time`. Idempotent."""
    from kombu.transport import redis as kredis

    kredis.time = clock


def reuse_clients() -> None:
    """One redis client object per channel for kombu's own short calls.

    kombu's `Channel.conn_or_acquire` builds a new `redis.Redis` for every call
    it serves: each delivery's `QoS.append`, each `QoS.ack`, each fanout
    publish. Building one copies redis-py's table of response callbacks, and at
    a few hundred samples a second that was 7-9% of a worker's CPU (py-spy,
    16 and 256 in flight). A redis-py client is thread-safe (each command and
    each pipeline takes a connection from the pool), so the channel keeps the
    first one it builds for its pool and hands it out again; a channel whose
    pool is replaced builds a new one. The asynchronous client (BRPOP, the
    event loop's) is kombu's as before. Idempotent."""
    from kombu.transport import redis as kredis

    built = kredis.Channel._create_client
    if getattr(built, "fleet_reuses", False):
        return

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return built(self, asynchronous=True)
        client = self.__dict__.get("_fleet_client")
        if client is None or client.connection_pool is not self.pool:
            client = self.__dict__["_fleet_client"] = built(self, asynchronous=False)
        return client

    _create_client.fleet_reuses = True
    kredis.Channel._create_client = _create_client


def on_ack(callback: Callable[[str], None]) -> None:
    """Call `callback(tag)` after each acknowledgement kombu's Redis QoS makes, so a worker
    remembers what it acknowledged (an ack that went to a primary being replaced is lost with
    it: `workers/failover.py` sends it again). Idempotent; a second callback replaces the first."""
    from kombu.transport import redis as kredis

    base = getattr(kredis.QoS.ack, "fleet_base", kredis.QoS.ack)

    def ack(self, delivery_tag):
        base(self, delivery_tag)
        callback(delivery_tag)

    ack.fleet_base = base
    kredis.QoS.ack = ack


_SENTINEL_POOLS: "weakref.WeakSet" = weakref.WeakSet()


def follow_sentinel_pools() -> None:
    """Keep a (weak) list of the connection pools kombu's `SentinelChannel` builds, so that a
    worker that learns of a failover drops their idle connections to the old primary at once
    (`sentinel_pools`), publishing channels included. Idempotent."""
    from kombu.transport import redis as kredis

    built = kredis.SentinelChannel._sentinel_managed_pool
    if getattr(built, "fleet_follows", False):
        return

    def _sentinel_managed_pool(self, asynchronous=False):
        pool = built(self, asynchronous)
        _SENTINEL_POOLS.add(pool)
        return pool

    _sentinel_managed_pool.fleet_follows = True
    kredis.SentinelChannel._sentinel_managed_pool = _sentinel_managed_pool


def sentinel_pools() -> list[Any]:
    """The Sentinel-managed pools kombu built in this process that are still in use."""
    return list(_SENTINEL_POOLS)


def unacked_messages(client) -> Iterator[dict]:
    """The messages every worker holds, as Celery protocol-2 dicts (headers, body, ...)."""
    for raw in client.hvals(UNACKED):
        yield json.loads(raw)[0]


def queued_messages(client, queue: str) -> Iterator[dict]:
    for name in queue_lists(queue):
        for raw in client.lrange(name, 0, -1):
            yield json.loads(raw)


def check() -> list[str]:
    """What of the kombu and Celery internals the fleet relies on this install no longer has;
    empty when every door still opens. The worker calls it once at start (`require`)."""
    return _kombu_redis_problems() + _kombu_qos_problems() + _celery_problems()


def require() -> None:
    """Refuse to start on a kombu or Celery whose internals moved (`check`), naming the
    installed versions and the ones the fleet was read from."""
    problems = check()
    if problems:
        raise RuntimeError(
            f"this fleet relies on kombu and Celery internals read from {READ_FROM}; the installed "
            f"{versions()} moved {len(problems)} of them: " + "; ".join(problems)
            + ". Install the versions pyproject.toml bounds.")


def versions() -> str:
    """The installed celery, kombu and redis-py, for messages."""
    import celery
    import kombu
    import redis

    return f"celery {celery.__version__}, kombu {kombu.__version__}, redis-py {redis.__version__}"


def _kombu_redis_problems() -> list[str]:
    from kombu.transport import redis as kredis

    problems = []
    channel = kredis.Channel
    for name, expected in (("sep", PRIORITY_SEP), ("unacked_key", UNACKED),
                           ("unacked_index_key", UNACKED_INDEX)):
        if getattr(channel, name, None) != expected:
            problems.append(f"kombu.transport.redis.Channel.{name} is {getattr(channel, name, None)!r}, "
                            f"not {expected!r}")
    if tuple(getattr(kredis, "PRIORITY_STEPS", ())) != PRIORITY_STEPS:
        problems.append(f"kombu.transport.redis.PRIORITY_STEPS is {getattr(kredis, 'PRIORITY_STEPS', None)!r}")
    for name in ("restore_unacked", "restore_unacked_once", "restore_by_tag", "restore_visible", "ack",
                 "reject", "_remove_from_indices"):
        if not callable(getattr(kredis.QoS, name, None)):
            problems.append(f"kombu.transport.redis.QoS.{name} is gone")
    if not _has_parameters(getattr(channel, "_create_client", None), "asynchronous") or "pool" not in dir(channel):
        problems.append("kombu.transport.redis.Channel._create_client(asynchronous) or .pool is gone")
    sentinel = getattr(kredis, "SentinelChannel", None)  # `sentinel://`: the same channel, its pool found by Sentinel
    if not (isinstance(sentinel, type) and issubclass(sentinel, channel)
            and sentinel._create_client is channel._create_client and sentinel.QoS is channel.QoS):
        problems.append("kombu.transport.redis.SentinelChannel no longer shares Channel's client and QoS")
    if not callable(getattr(sentinel, "_sentinel_managed_pool", None)):
        problems.append("kombu.transport.redis.SentinelChannel._sentinel_managed_pool is gone")
    if not hasattr(kredis.QoS, "restore_at_shutdown"):
        problems.append("kombu.transport.redis.QoS.restore_at_shutdown is gone")
    for name in ("append", "restore_visible"):  # lease scores read the module's `time` (`use_clock`)
        code = getattr(getattr(kredis.QoS, name, None), "__code__", None)
        if code is None or "time" not in code.co_names or not callable(getattr(kredis, "time", None)):
            problems.append(f"kombu.transport.redis.QoS.{name} no longer reads the module's time()")
    return problems


def _kombu_qos_problems() -> list[str]:
    """The virtual QoS's delivered and dirty sets (`held`, `mark_acked`), the prefetch QoS the
    health gate sets, and the producer's batch (`contract.publish`)."""
    from kombu import Producer
    from kombu.common import QoS as PrefetchQoS
    from kombu.transport.virtual import base

    problems = []
    qos = base.QoS(channel=SimpleNamespace(do_restore=False), prefetch_count=1)
    for name, kind in (("_delivered", dict), ("_dirty", set)):
        if not isinstance(getattr(qos, name, None), kind):
            problems.append(f"kombu.transport.virtual.base.QoS has no {name} {kind.__name__}")
    if not callable(getattr(getattr(qos, "_on_collect", None), "cancel", None)):
        problems.append("kombu.transport.virtual.base.QoS has no _on_collect")
    prefetch = PrefetchQoS(lambda **_: None, 1)
    if not (hasattr(prefetch, "value") and callable(getattr(prefetch, "update", None))):
        problems.append("kombu.common.QoS has no value or update()")
    if not callable(getattr(Producer, "batch", None)):
        problems.append("kombu.Producer.batch is gone")
    return problems


def _celery_problems() -> list[str]:
    """The consumer's hooks and steps the worker overrides or requires, the event dispatcher's
    buffers (`workers/events.py`), `as_task_v2` (`contract.publish`), the loggers the worker
    quiets, and the pickle check that keeps an expected task failure expected."""
    from celery import Celery
    from celery.app import trace
    from celery.events.dispatcher import EventDispatcher
    from celery.utils.serialization import get_pickleable_exception
    from celery.worker import strategy
    from celery.worker.consumer import Consumer, events, tasks

    problems = [f"celery.worker.consumer.Consumer.{name} is gone" for name in (
        "on_connection_error_after_connected", "on_send_event_buffered", "add_task_queue", "cancel_task_queue")
        if not callable(getattr(Consumer, name, None))]
    for module, step in ((tasks, "Tasks"), (events, "Events")):
        if not hasattr(module, step):
            problems.append(f"the consumer step {module.__name__}:{step} is gone")
    if not _has_parameters(EventDispatcher, "buffer_group", "buffer_limit", "on_send_buffered"):
        problems.append("celery's EventDispatcher takes no buffer_group, buffer_limit or on_send_buffered")
    dispatcher = EventDispatcher(enabled=False, app=Celery(set_as_current=False), buffer_group=["task"])
    for name in ("_outbound_buffer", "_group_buffer", "buffer_limit", "flush", "extend_buffer"):
        if not hasattr(dispatcher, name):
            problems.append(f"celery's EventDispatcher has no {name}")
    try:
        message = Celery(set_as_current=False).amqp.as_task_v2(
            "t", "n", ("run", "p"), argsrepr="", kwargsrepr="", origin="o", ignore_result=None)
        if message.headers.get("id") != "t" or len(message) != 4:
            problems.append("celery's as_task_v2 returns another message")
    except (AttributeError, TypeError) as exc:
        problems.append(f"celery's as_task_v2 changed: {exc!r}")
    for module, name in ((trace, "celery.app.trace"), (strategy, "celery.worker.strategy")):
        if getattr(getattr(module, "logger", None), "name", None) != name:
            problems.append(f"celery logs its per-task lines elsewhere than {name}")
    if not isinstance(get_pickleable_exception(_Expected("reason", "message")), _Expected):
        problems.append("celery wraps an exception whose args are its constructor's (a task's throws)")
    return problems


class _Expected(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(reason, message)


def _has_parameters(function, *names: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)
