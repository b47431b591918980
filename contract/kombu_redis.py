"""The one door to kombu's Redis transport internals, and the check of every kombu and Celery internal.

The fleet needs a few things kombu does not expose: the deliveries a channel
still holds (to renew their leases, acknowledge them and hand them back), the
sorted set that scores them, the hash of unacknowledged messages, the
priority sub-lists of a queue (read by the lost-message audit), and a way to keep a
channel's deliveries when the channel closes because its connection was lost
(`detach`). Each is read here and nowhere else, with the kombu version it was
read from. `check()` lists what an upgrade moved, of these and of the Celery
internals the worker relies on elsewhere (its consumer's hooks and steps, the
event dispatcher's buffers, `as_task_v2`, the heartbeat's send: `heartbeats_never_wait`); the worker refuses to start on such
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
The tag travels in the message itself (`properties.delivery_tag`, set when it
was published), which is how a task knows its own (`request.properties`).

`batch_takes` replaces kombu's take and acknowledgement with fewer commands
(`kombu_take.py` says how): `Channel._brpop_read` (BRPOP's reply parsed, the
queue cycle rotated, one message delivered), `QoS.append`, `QoS.ack` and
`QoS.reject`, each checked against a hash of its 5.7.0 source (`REPLACED`;
where one differs, kombu's own are kept), and `QoS.can_consume_max_estimate`
(the prefetch count's room).

Lease scores are times in kombu: `QoS.append` scores a delivery with the
module's `time()` and `QoS.restore_visible` restores what scores from 0 up to
`time() - visibility_timeout`, each on the clock of the worker that runs it.
Workers whose clocks disagree would restore each other's fresh deliveries (or
keep a dead worker's for as long as its clock ran ahead), so `use_clock`
points that `time` at Redis's clock (`contract/clock.py`), and the lease
keeper renews on it too: every score is written and compared on one clock.
Where `batch_takes` is installed, a delivery is scored instead with its
worker's lease holder, below 0 and so outside the sweep, until its worker's
lease lapses (`worker_lease.py`); where kombu's own take is kept, each
delivery's time score is renewed as kombu has it.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import threading
import weakref
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

from . import patches

log = logging.getLogger(__name__)
READ_FROM = "5.7.0"
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


def settled(tags: Iterable[str]) -> None:
    """These deliveries are acknowledged in Redis already (with their group commit): kombu's ack
    of each, when its task returns, settles only its channel's memory (`batch_takes`)."""
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


def share_client(client: Callable[[], Any]) -> None:
    """kombu's own short calls go through `client()`, the worker's shared client.

    kombu's `Channel.conn_or_acquire` builds a new `redis.Redis` for every call
    it serves (each delivery's `QoS.append`, each `QoS.ack`, each event and
    fanout publish, the restore sweep), on a pool of its own per channel and
    connection: building one copied redis-py's table of response callbacks
    (7-9% of a busy worker's CPU, py-spy), and the pools of the consumer's,
    the events' and remote control's connections each kept connections open
    (10 to 15 a worker in all). A redis-py client is thread-safe (each command
    and each pipeline takes a connection from its pool), and kombu's broker is
    the fleet's Redis (same URL and database), so every channel hands out the
    worker's own client (`workers/intake/redis_pool.py`: a few connections, shared;
    its retries wait out an outage, except on the event loop's thread, whose calls
    fail fast as kombu's own clients did: `contract/retries.py`).
    The asynchronous clients (BRPOP, the remote-control subscription: the
    event loop's) are kombu's as before, but a new channel's check of Redis
    (`Channel.__init__` pings its asynchronous client) goes through the shared
    client too: kombu opens a channel whenever a thread publishes while the
    producer pool's are busy, and a connection opened for the check, however
    briefly, was a fifth connection for a moment (`python -m bench --parts
    fleet` once saw 5). A channel that fetches or subscribes opens its own
    when it starts. kombu's pool is still built (it opens nothing): building it
    sets the database in the fanout topics events and remote-control replies
    go to. Idempotent."""
    from kombu.transport import redis as kredis

    def shared(built):
        def _create_client(self, asynchronous=False):
            if asynchronous:
                return built(self, asynchronous=True)
            return client()
        return _create_client

    def check_shared(init):
        def __init__(self, *args, **kwargs):
            self.client = client()  # kombu's `client` is a cached property: this is what the check pings
            try:
                init(self, *args, **kwargs)
            finally:
                del self.client  # BRPOP's own client is built when the channel first fetches
            # kombu's pool for its own clients, built (no connection): building it is also what puts
            # the database into the fanout topics (`/{db}.` -> `/0.`), which a channel that only
            # publishes through the shared client would otherwise send events and replies to
            self.async_pool
        return __init__

    patches.replace(kredis.Channel, "_create_client", shared)
    patches.replace(kredis.Channel, "__init__", check_shared)


def on_ack(callback: Callable[[str], None]) -> None:
    """Call `callback(tag)` after each acknowledgement kombu's Redis QoS makes, so a worker
    remembers what it acknowledged (an ack that went to a primary being replaced is lost with
    it: `workers/intake/failover.py` sends it again). Idempotent; a second callback replaces the first."""
    from kombu.transport import redis as kredis

    def noted(base):
        def ack(self, delivery_tag):
            base(self, delivery_tag)
            callback(delivery_tag)
        return ack

    patches.replace(kredis.QoS, "ack", noted)


def heartbeats_never_wait() -> None:
    """Celery's worker-heartbeat events go out without kombu's `ensure`. Celery sends them from the
    event loop's timer with `retry=True` and no policy, so one sent while Redis is down reconnects
    the events connection until Redis is back, holding the loop all that while (py-spy:
    `Heart._send` -> `Connection._ensure_connection`): the worker noticed the lost broker only
    then. Without it, a heartbeat Redis cannot take waits in the dispatcher's outbound buffer, which
    the next flush sends (`workers/reporting/events.py`). Idempotent."""
    from celery.worker import heartbeat

    def without_retry(base):
        def _send(self, event, retry=True):
            return base(self, event, retry=False)
        return _send

    patches.replace(heartbeat.Heart, "_send", without_retry)


_SENTINEL_POOLS: "weakref.WeakSet" = weakref.WeakSet()


def follow_sentinel_pools() -> None:
    """Keep a (weak) list of the connection pools kombu's `SentinelChannel` builds, so that a
    worker that learns of a failover drops their idle connections to the old primary at once
    (`sentinel_pools`), publishing channels included. Idempotent."""
    from kombu.transport import redis as kredis

    def listed(built):
        def _sentinel_managed_pool(self, asynchronous=False):
            pool = built(self, asynchronous)
            _SENTINEL_POOLS.add(pool)
            return pool
        return _sentinel_managed_pool

    patches.replace(kredis.SentinelChannel, "_sentinel_managed_pool", listed)


def sentinel_pools() -> list[Any]:
    """The Sentinel-managed pools kombu built in this process that are still in use."""
    return list(_SENTINEL_POOLS)


# What `batch_takes` replaces or skips, as read from kombu 5.7.0 (a hash of each one's source):
# where any of them differs, kombu's own take and ack are kept, never patched blindly.
REPLACED = {"Channel._brpop_read": "c42518699709f2df", "QoS.append": "35c655f6ecc62fe6",
            "QoS.ack": "1bc15a4ddf541af6", "QoS.reject": "747a02434344d1a6"}


def takes_batched() -> bool:
    """Whether `batch_takes` is installed: deliveries are scored by their worker's lease holder
    (`worker_lease`), not by time."""
    from kombu.transport import redis as kredis

    return patches.is_replaced(kredis.Channel._brpop_read)


def batch_takes() -> bool:
    """kombu's take and acknowledgement in few Redis commands (`kombu_take` says how and why).

    `Channel._brpop_read` is kombu's own but for its last step: the message BRPOP
    took and up to the prefetch count's room more are recorded and taken by one
    script, then delivered in order; `QoS.append` leaves what the script recorded
    to it (the channel's memory only), and `QoS.ack` and `QoS.reject` leave what a
    group commit acknowledged (`settled`). A channel with a global key prefix (not
    the fleet's) keeps kombu's way, and so does a kombu whose versions of these differ
    from the ones read (`REPLACED`): it works as before, at kombu's cost, and says so.
    Returns whether the batched way is installed. Idempotent."""
    from kombu.transport import redis as kredis
    from kombu.transport.virtual import base as virtual

    from . import worker_lease

    channel, qos = kredis.Channel, kredis.QoS
    if takes_batched():  # only this replaces it
        return True
    moved = [name for name, expected in REPLACED.items()
             if _source_hash(getattr(getattr(kredis, name.split(".")[0]), name.split(".")[1], None)) != expected]
    if moved:
        log.warning(
            "kombu's take and acknowledgement kept as kombu does them (about ten more Redis commands a "
            "sample): %s not the one(s) read from kombu %s", ", ".join(moved), READ_FROM)
        return False
    def recorded_once(append):
        def _append(self, message, delivery_tag):
            recorded = self.__dict__.get("fleet_recorded")
            if recorded and delivery_tag in recorded:
                recorded.discard(delivery_tag)
                return virtual.QoS.append(self, message, delivery_tag)
            append(self, message, delivery_tag)  # one the take could not read: kombu's record, by time
            with self.channel.conn_or_acquire() as client:  # then under this worker's lease, as taken ones
                worker_lease.hold(client, worker_lease.HOLDER, kredis.time(), [delivery_tag])
        return _append

    def settled_ack(ack):
        def _ack(self, delivery_tag):
            if _SETTLED.pop(delivery_tag):
                return virtual.QoS.ack(self, delivery_tag)
            return ack(self, delivery_tag)
        return _ack

    def settled_reject(reject):
        def _reject(self, delivery_tag, requeue=False):
            if _SETTLED.pop(delivery_tag):  # acknowledged with its group commit: nothing to restore
                return virtual.QoS.ack(self, delivery_tag)
            return reject(self, delivery_tag, requeue)
        return _reject

    def taking_more(read):
        def _brpop_read(self, **options):
            if self.global_keyprefix:
                return read(self, **options)
            try:
                return _read_and_take(self, options)
            finally:
                self._in_poll = None
                self._flush_brpop_reauth()
        return _brpop_read

    for owner, name, build in ((qos, "append", recorded_once), (qos, "ack", settled_ack),
                               (qos, "reject", settled_reject), (channel, "_brpop_read", taking_more)):
        patches.replace(owner, name, build)
    return True


def _read_and_take(self, options: dict) -> bool:
    """kombu 5.7.0's `_brpop_read` body, its delivery of the one message BRPOP took replaced by
    `kombu_take.take`'s: that message and what else the prefetch count allows, each recorded."""
    from kombu.transport import redis as kredis
    from kombu.utils.encoding import bytes_to_str
    from kombu.utils.json import loads

    from . import kombu_take, worker_lease

    try:
        dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
    except self.connection_errors:
        self.client.connection.disconnect()
        raise
    if not dest__item:
        raise kredis.Empty()
    dest, item = dest__item
    dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
    self._queue_cycle.rotate(dest)
    first = loads(bytes_to_str(item))
    readable = kombu_take.readable(first)
    queues = self._queue_cycle.consume(len(self.active_queues))
    lists = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
    room = self.qos.can_consume_max_estimate()
    with self.conn_or_acquire() as client:
        taken = kombu_take.take(client, lists, first if readable else None,
                                kombu_take.MOST_PER_TAKE if room is None else room - 1, kredis.time(),
                                worker_lease.HOLDER)
    recorded = self.qos.__dict__.setdefault("fleet_recorded", set())
    if readable:
        recorded.add(first["properties"]["delivery_tag"])
    self.connection._deliver(first, dest)
    for message in taken:
        if message.recorded:
            recorded.add(message.payload["properties"]["delivery_tag"])
        self.connection._deliver(message.payload, message.source.rsplit(self.sep, 1)[0])
    return True


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


def check() -> list[str]:
    """What of the kombu and Celery internals the fleet relies on this install no longer has;
    empty when every door still opens. The worker calls it once at start (`require`)."""
    from . import kombu_listen

    return _kombu_redis_problems() + _kombu_qos_problems() + _celery_problems() + kombu_listen.problems()


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
    for name in ("can_consume_max_estimate",):
        if not callable(getattr(kredis.QoS, name, None)):
            problems.append(f"kombu.transport.redis.QoS.{name} is gone")
    for name in ("_q_for_pri", "_flush_brpop_reauth", "conn_or_acquire"):
        if not callable(getattr(channel, name, None)):
            problems.append(f"kombu.transport.redis.Channel.{name} is gone")
    if "ping" not in getattr(patches.library_own(channel.__init__), "__code__", None).co_names \
            or not isinstance(getattr(channel, "async_pool", None), property):
        problems.append("kombu.transport.redis.Channel no longer checks Redis with a ping on its async_pool")
    if not callable(getattr(sentinel, "_sentinel_managed_pool", None)):
        problems.append("kombu.transport.redis.SentinelChannel._sentinel_managed_pool is gone")
    if not hasattr(kredis.QoS, "restore_at_shutdown"):
        problems.append("kombu.transport.redis.QoS.restore_at_shutdown is gone")
    sweep = patches.library_own(getattr(kredis.QoS, "restore_visible", None))
    try:  # a delivery scored below 0 (`worker_lease`) must stay outside the sweep's range
        reads_from_zero = "unacked_index_key, ceil, 0," in " ".join(inspect.getsource(sweep).split())
    except (TypeError, OSError):
        reads_from_zero = False
    if not reads_from_zero:
        problems.append("kombu.transport.redis.QoS.restore_visible no longer restores scores from 0 up to its cut-off")
    for name in ("append", "restore_visible"):  # lease scores read the module's `time` (`use_clock`)
        found = getattr(kredis.QoS, name, None)
        code = getattr(patches.library_own(found), "__code__", None)
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
    buffers (`workers/reporting/events.py`), `as_task_v2` (`contract.publish`), the loggers the worker
    quiets, and the pickle check that keeps an expected task failure expected."""
    from celery import Celery
    from celery.app import trace
    from celery.events.dispatcher import EventDispatcher
    from celery.utils.serialization import get_pickleable_exception
    from celery.worker import strategy
    from celery.worker.consumer import Consumer, events, tasks
    from kombu.utils.imports import symbol_by_name

    problems = [f"celery.worker.consumer.Consumer.{name} is gone" for name in (
        "on_connection_error_after_connected", "on_send_event_buffered", "add_task_queue", "cancel_task_queue")
        if not callable(getattr(Consumer, name, None))]
    for module, step in ((tasks, "Tasks"), (events, "Events")):
        if not hasattr(module, step):
            problems.append(f"the consumer step {module.__name__}:{step} is gone")
    from celery.worker.consumer import heart

    if not _has_parameters(heart.Heart, "heartbeat_interval"):
        problems.append("celery's Heart step takes no heartbeat_interval (the worker sets it)")
    from celery.worker import heartbeat

    if not _has_parameters(patches.library_own(heartbeat.Heart._send), "retry"):
        problems.append("celery's Heart._send takes no retry (the worker sends heartbeats without it)")
    if not _has_parameters(Consumer, "worker_options"):
        problems.append("celery's Consumer takes no worker_options (the worker turns gossip and mingle off there)")
    for step, option in zip(GROWS_WITH_FLEET, WITHOUT_GROWS_WITH_FLEET):
        found = symbol_by_name(step) if step in Consumer.Blueprint.default_steps else None
        if found is None or not _has_parameters(found, option):
            problems.append(f"the consumer step {step} is gone or no longer takes {option} (the worker turns it off)")
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


def _source_hash(function) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return None


def _has_parameters(function, *names: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)
