"""The worker's kombu transport: kombu's Redis transport, extended through its own doors.

Celery selects it with `broker_transport` (`workers/celery.py`: this module's
`Transport`, or `SentinelTransport` for a `sentinel://` URL), and kombu builds
its channels, QoS and poller from the classes named here: subclasses of kombu
5.7.0's (`kombu/transport/redis.py`, pinned in `constraints.txt`). Nothing of
kombu's is replaced in place: a process that imports this module, or builds
another Celery app, gets kombu's transport unchanged. What the subclasses add:

- **the batched take** (`Channel._brpop_read`): the message BRPOP took, and
  up to the prefetch count's room more, are recorded under this worker's lease
  and taken by one script (`contract/broker/kombu_take.py`), then delivered in order;
  `QoS.append` leaves what the script recorded to the channel's memory, and
  `QoS.ack` / `QoS.reject` leave what a group commit acknowledged
  (`kombu_redis.settled`). A take whose reply is lost (the connection cut after
  Redis ran the script) strands nothing: it carries a token, stays pending on
  its thread until its reply is read, and is run again with the same token, by
  redis-py's one fail-fast retry or, after a reconnect, before the next
  channel's first BRPOP on that thread (`_PENDING`): the script then returns
  what that take recorded instead of taking more.
- **one client per channel for kombu's short calls** (`_create_client`): every
  QoS append, ack, restore and publish goes through the worker's shared client
  (`redis_pool.shared`), and so does a new channel's check of Redis (its
  ping); BRPOP and the subscription keep kombu's own connections. A channel
  with a `global_keyprefix` or a `credential_provider` would need clients of
  kombu's making: the worker refuses both at start (`refusal`), and a channel
  meeting one anyway keeps kombu's own clients.
- **lease scores on Redis's clock**: the take, the record of a message kombu
  delivered itself (`QoS.append`) and the restore sweep's cut-off
  (`QoS.restore_visible`) read `TIME` inside their scripts, never this
  machine's clock.
- **detaching on connection loss** (`QoS.detach`): a channel closed under
  running tasks restores nothing, and its tasks' acks and rejects go to the
  worker (`workers/intake/consumer.py`).
- **acknowledgements confirmed after a failover**: behind Sentinel, each ack
  and each reject without requeue is remembered (`recent.ACKED`) and sent
  again on the new primary (`failover.py`), whose pools it finds here
  (`sentinel_pools`).
- **no message held in a socket**: a BRPOP is in flight whenever the worker
  has room, and its room can shrink under it (the gate lowers the prefetch
  count, or stops consuming, when the servers go down: `gate.py`). kombu 5.7.0
  then pauses the BRPOP and keeps the message it took in the socket, unread,
  until room returns, minutes maybe: in no list and not in `unacked`, so the
  audit counts it lost and publishes it again, and a worker that dies
  meanwhile takes it with it. Here the reply is read once it came (within the
  BRPOP's one-second timeout) and its message put back at the head of its
  list, where BRPOP took it (`MultiChannelPoller._update_brpop_polling`); so
  is one that comes for a queue the worker stopped consuming meanwhile
  (kombu would record it, then requeue it at the back with a warning).
- **subscriptions heard again after a reconnect** (`MultiChannelPoller`):
  see `_client_registered`.
"""
from __future__ import annotations

import itertools
import logging
import threading
import weakref
from typing import Any, Callable, NamedTuple
from urllib.parse import parse_qs, quote, urlsplit

from kombu.transport import redis as kredis
from kombu.transport.virtual import base as virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from kombu.utils.url import as_url
from redis.client import PubSub
from redis.exceptions import RedisError, ResponseError

from contract.broker import kombu_redis, kombu_take, worker_lease
from contract.redis_link.scripts import Lua

from . import redis_pool
from .recent import ACKED

log = logging.getLogger(__name__)

PATH = "workers.intake.transport:Transport"
SENTINEL_PATH = "workers.intake.transport:SentinelTransport"

# The restore sweep's page of lapsed leases, its cut-off on Redis's clock: kombu 5.7.0's
# `ZRANGE unacked_index <now - visibility> 0 BYSCORE REV LIMIT start num`, `now` read by the script.
LAPSED = Lua("""
local t = redis.call('TIME')
local ceil = tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(a.visibility)
if tonumber(a.num) > 0 then
  return redis.call('ZRANGE', KEYS[1], ceil, 0, 'BYSCORE', 'REV', 'LIMIT', a.start, a.num)
end
return redis.call('ZRANGE', KEYS[1], ceil, 0, 'BYSCORE', 'REV')
""", head=("visibility", "start", "num"))


def transport_for(redis_url: str) -> str:
    """The `broker_transport` for a broker URL: this module's, plain or behind Sentinel."""
    return SENTINEL_PATH if redis_url.startswith("sentinel://") else PATH


def refusal(broker_url: str, transport_options: dict) -> str | None:
    """Why a worker cannot share its client with kombu on this broker (one line), or None: a
    global key prefix or a credential provider, which only kombu's own clients apply."""
    if transport_options.get("global_keyprefix"):
        return ("worker refused to start: the broker's global_keyprefix is not supported (the worker's "
                "shared Redis client and the fleet's keys are unprefixed)")
    queries = [parse_qs(urlsplit(part).query) for part in broker_url.split(";") if part.strip()]
    if transport_options.get("credential_provider") or any("credential_provider" in q for q in queries):
        return ("worker refused to start: a kombu credential_provider is not supported (the worker's "
                "shared Redis client authenticates with REDIS_URL's credentials)")
    return None


class _KeepTransport:
    """`broker_failover_strategy`: a `sentinel://h1;sentinel://h2` URL is one broker whose Sentinels
    the transport asks itself, so a failed connect "switches" to the same first host. kombu's own
    switch would parse a full URL again and put kombu's transport back in this one's place. Shown
    by its name where Celery reports the connection (`celery inspect stats`: kombu's JSON)."""
    NAME = "workers.intake.transport:keep_transport"

    def __call__(self, alternates: list) -> Any:
        first = alternates[0] if alternates else None
        if isinstance(first, str) and "://" in first:
            first = urlsplit(first).hostname
        return itertools.repeat(first)

    def __json__(self) -> str:
        return self.NAME

    def __repr__(self) -> str:
        return self.NAME


keep_transport = _KeepTransport()


class _Pending(NamedTuple):
    """A take whose reply this process has not read yet."""
    token: str
    lists: list
    dest: str
    first: dict | None
    entry: str | None
    most: int


class _PendingTakes(threading.local):
    """Takes sent and not read back, per thread: a reconnect builds a new channel (and connection)
    on the thread that lost the old one (Celery's consumer), and the first thing it does is read
    them back. Other threads (Flower's remote-control replies) take on their own connections, each
    in its own lane."""

    def __init__(self) -> None:
        self._takes: dict[str, _Pending] = {}

    def add(self, take: _Pending) -> None:
        self._takes[take.token] = take

    def done(self, token: str) -> None:
        self._takes.pop(token, None)

    def all(self) -> list[_Pending]:
        return list(self._takes.values())


_PENDING = _PendingTakes()
_SENTINEL_POOLS: "weakref.WeakSet" = weakref.WeakSet()


def pending_takes() -> int:
    """How many takes of this thread wait to be read back (0 but just after a lost reply)."""
    return len(_PENDING.all())


def sentinel_pools() -> list[Any]:
    """The Sentinel-managed pools this process's channels built that are still in use."""
    return list(_SENTINEL_POOLS)


class QoS(kredis.QoS):
    """kombu's Redis QoS, with the fleet's record, acknowledgement and sweep (module docstring)."""
    notes_acks = False  # behind Sentinel: each ack remembered, sent again after a failover
    _detached: tuple[Callable[[str], None], Callable[[str], None]] | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._recorded: set[str] = set()  # tags the take recorded in Redis already

    def recorded(self, tag: str) -> None:
        self._recorded.add(tag)

    def append(self, message, delivery_tag):
        if delivery_tag in self._recorded:
            self._recorded.discard(delivery_tag)
            return virtual.QoS.append(self, message, delivery_tag)
        # one the take could not read (kombu's own path delivered it): recorded under this
        # worker's lease, as taken ones, on Redis's clock
        delivery = message.delivery_info
        entry = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.channel.conn_or_acquire() as client:
            kombu_take.record(client, delivery_tag, entry, worker_lease.HOLDER)
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag):
        if self._detached is not None:
            self._detached[0](delivery_tag)
            self._dirty.add(delivery_tag)
            return
        if kombu_redis.settled_pop(delivery_tag):
            virtual.QoS.ack(self, delivery_tag)
        else:
            super().ack(delivery_tag)
        if self.notes_acks:
            ACKED.add(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        if self._detached is not None:
            self._detached[1 if requeue else 0](delivery_tag)
            self._dirty.add(delivery_tag)
            return
        if kombu_redis.settled_pop(delivery_tag):  # acknowledged with its group commit: nothing to restore
            virtual.QoS.ack(self, delivery_tag)
        else:
            super().reject(delivery_tag, requeue)
        if self.notes_acks and not requeue:  # removed from Redis as an ack is: confirmed after a failover too
            ACKED.add(delivery_tag)

    def detach(self, on_ack: Callable[[str], None], on_requeue: Callable[[str], None]) -> None:
        """Keep this QoS's deliveries when its channel closes: it restores nothing at close (nor
        when collected), and an ack or reject calls `on_ack(tag)` or, for a reject with
        requeue, `on_requeue(tag)`, instead of using the closed channel."""
        self._detached = (on_ack, on_requeue)

    @property
    def detached(self) -> bool:
        return self._detached is not None

    def restore_unacked(self, client=None):
        if self._detached is not None:
            return []
        return super().restore_unacked(client)

    def restore_unacked_once(self, stderr=None):
        if self._detached is not None:
            self._on_collect.cancel()
            return None
        return super().restore_unacked_once(stderr)

    def restore_visible(self, start=0, num=10, interval=10):
        """kombu 5.7.0's sweep, its cut-off read on Redis's clock inside the script."""
        if self._detached is not None:
            return
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        with self.channel.conn_or_acquire() as client:
            try:
                with kredis.Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    visible = LAPSED(client, [self.unacked_index_key],
                                     {"visibility": repr(float(self.visibility_timeout)),
                                      "start": int(num and start or 0), "num": int(num or 0)})
                    for tag in visible or []:
                        self.restore_by_tag(bytes_to_str(tag), client)
            except kredis.MutexHeld:
                pass


class SentinelQoS(QoS):
    notes_acks = True


class _Fleet:
    """What the plain and the Sentinel channel add to kombu's (the module docstring)."""

    def __init__(self, *args, **kwargs):
        shared = redis_pool.shared()
        if shared is None:
            super().__init__(*args, **kwargs)
            return
        self.client = shared  # kombu's `client` is a cached property: this is what its check pings
        try:
            super().__init__(*args, **kwargs)
        finally:
            del self.client  # BRPOP's own client is built when the channel first fetches
        # kombu's pool for its own clients, built (no connection): building it also puts the database
        # into the fanout topics (`/{db}.` -> `/0.`), which a channel that only publishes through the
        # shared client would otherwise send events and replies to
        self.async_pool

    def _shares(self) -> bool:
        return not self.global_keyprefix and redis_pool.shared() is not None \
            and not self.connection.client.credential_provider

    def _create_client(self, asynchronous=False):
        if asynchronous or not self._shares():
            return super()._create_client(asynchronous=asynchronous)
        return redis_pool.shared()

    def _brpop_start(self, timeout=None):
        if self.global_keyprefix:
            return super()._brpop_start(timeout)
        self._read_back_pending()  # a take whose reply a lost connection cut off: delivered first
        return super()._brpop_start(timeout)

    def _brpop_read(self, **options):
        if self.global_keyprefix:
            return super()._brpop_read(**options)
        try:
            return self._read_and_take(options)
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _read_and_take(self, options: dict) -> bool:
        """kombu 5.7.0's `_brpop_read` body, its delivery of the one message BRPOP took replaced by
        `kombu_take.take`'s: that message and what else the prefetch count allows, each recorded."""
        try:
            dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
        except self.connection_errors:
            self.client.connection.disconnect()
            raise
        if dest__item:
            dest_list, item = dest__item
            dest = bytes_to_str(dest_list).rsplit(self.sep, 1)[0]
            if dest not in self.active_queues:  # no longer consumed: BRPOP took it as the gate stopped consuming
                self._put_back(dest_list, item)
                dest__item = None
        self._read_back_pending()
        if not dest__item:
            raise kredis.Empty()
        self._queue_cycle.rotate(dest)
        first = loads(bytes_to_str(item))
        readable = kombu_take.readable(first)
        queues = self._queue_cycle.consume(len(self.active_queues))
        lists = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        room = self.qos.can_consume_max_estimate()
        most = kombu_take.MOST_PER_TAKE if room is None else room - 1
        take = _Pending(kombu_take.new_token(), lists, dest, first if readable else None, None, most)
        _PENDING.add(take)
        if not readable:
            self.connection._deliver(first, dest)  # kombu's own path records (or refuses) it
        self._run(take)
        return True

    def give_back_paused(self, connection, sock) -> bool:
        """A BRPOP that kombu paused for want of room (the module docstring): once its reply came, the
        message it took goes back to the head of its list. True when the reply was read (or its
        connection is gone), and the pause is over."""
        if self._in_poll is not connection or connection._sock is not sock:
            return False
        reply = None
        try:
            if not connection.can_read(timeout=0):
                return False
            reply = self.client.parse_response(connection, "BRPOP")
        except ResponseError as exc:  # an error reply (UNBLOCKED, its primary demoted): it took nothing
            log.info("broker: a paused BRPOP ended with %r", exc)
        except (*self.connection_errors, RedisError) as exc:  # what it took, if anything, is the audit's
            log.warning("broker: a paused BRPOP's connection failed (%r)", exc)
            connection.disconnect()
        self._in_poll = None
        self._flush_brpop_reauth()  # as kombu's own read does: a credential rotated meanwhile is sent now
        if reply:
            self._put_back(*reply)
        return True

    def _put_back(self, dest_list: bytes, item: bytes) -> None:
        """A message BRPOP took that this channel does not deliver: back at the head of its list (BRPOP
        takes from the right), as if never taken."""
        try:
            with self.conn_or_acquire() as client:
                client.rpush(dest_list, item)
        except Exception as exc:  # Redis down: the audit republishes what is in no list and not in unacked
            log.warning("broker: a message taken but not delivered could not go back to %s (%r)",
                        bytes_to_str(dest_list), exc)

    def _read_back_pending(self) -> None:
        for take in _PENDING.all():
            self._run(take)

    def _run(self, take: _Pending) -> None:
        """Run a take (again, with its token, where its reply was lost) and deliver what it holds."""
        with self.conn_or_acquire() as client:
            taken = kombu_take.take(client, take.lists, take.first, take.most, worker_lease.HOLDER,
                                    token=take.token, entry=take.entry, lane=str(threading.get_ident()))
        _PENDING.done(take.token)
        qos = self.qos
        for message in taken:  # BRPOP's message first (list ''), then the rest in order
            source = take.dest if message.source == "" else message.source.rsplit(self.sep, 1)[0]
            if message.recorded:
                qos.recorded(message.payload["properties"]["delivery_tag"])
            self.connection._deliver(message.payload, source)


class Channel(_Fleet, kredis.Channel):
    QoS = QoS


class SentinelChannel(_Fleet, kredis.SentinelChannel):
    QoS = SentinelQoS

    def _sentinel_managed_pool(self, asynchronous=False):
        """kombu's, listed (weakly), so that a worker that learns of a failover drops their idle
        connections to the old primary at once (`failover.py`), publishing channels' included."""
        pool = super()._sentinel_managed_pool(asynchronous)
        _SENTINEL_POOLS.add(pool)
        return pool


class MultiChannelPoller(kredis.MultiChannelPoller):
    """A fanout subscriber that kombu polls without an event loop hears again after Redis closed
    its connection.

    Flower's event receiver (`flower.events.Events` -> Celery's `EventReceiver`
    -> `Connection.drain_events`) reads worker events from a Redis pub/sub
    subscription (kombu's fanout exchange is PSUBSCRIBE). Without an event loop,
    kombu's `MultiChannelPoller` registers the subscription's socket with its
    poller once and, before each poll, asks `_client_registered` only whether the
    client has a socket and a registration, not whether that registration is
    this socket. The fleet's broker connections retry a failed read
    (`retry_on_timeout`, `contract/broker/config.py`), so when Redis closes the
    subscription, redis-py reconnects inside kombu's read (behind Sentinel, to
    the primary the Sentinels name now) and subscribes again on a new socket that
    kombu never polls: the receiver hears nothing more and raises nothing, so
    Flower's own reconnect loop never runs. Sentinel closes every pub/sub client
    of a primary it demotes (`CLIENT KILL TYPE pubsub`, with the normal ones): after
    every `SENTINEL FAILOVER`, and when a frozen primary resumes. A plain
    `REPLICAOF` keeps them, and a demoted primary still relays what the new one
    publishes, so only the closed connection leaves the receiver deaf.

    `_client_registered` here also compares the registered
    socket with the client's socket of now: a replaced one is registered again
    and subscribed again (kombu's own `_register_LISTEN`; a second PSUBSCRIBE of
    a pattern is a no-op in Redis). The worker's event loop already drops a
    closed connection's registration (kombu's `register_with_event_loop`), so
    there the check changes nothing. Read from kombu 5.7.0's
    `kombu/transport/redis.py` (`MultiChannelPoller._client_registered`,
    `_chan_to_sock`, `_register_LISTEN`), pinned (`constraints.txt`).
    """

    def _update_brpop_polling(self):
        """kombu's pause and resume of BRPOPs by room; a paused one's message then goes back to its list
        once its reply came (the module docstring), rather than wait in the socket."""
        super()._update_brpop_polling()
        for fd, (channel, _client, connection, sock) in list(self._paused_brpop.items()):
            if isinstance(channel, _Fleet) and not channel.global_keyprefix \
                    and channel.give_back_paused(connection, sock) and fd in self._paused_brpop:
                self._discard_paused_brpop(fd)  # (a failed connection's disconnect discarded it already)

    def _client_registered(self, channel, client, cmd):
        found = super()._client_registered(channel, client, cmd)  # takes the client's connection if none
        if isinstance(client, PubSub):  # redis-py's own resubscribe, on every reconnect
            client.connection.register_connect_callback(client.on_connect)
        return found and self._chan_to_sock.get((channel, client, cmd)) is client.connection._sock


class _Shown:
    """A connection shown (`Connection.as_uri`: Celery's banner, Flower's log, its broker page)
    under the scheme of the URL it was given, not under this transport's import path."""
    scheme = "redis"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cycle = MultiChannelPoller()
        # kombu parsed the URL already (the class says it cannot: `Connection.__init__` asks the
        # class); `as_uri` asks the instance, and kombu then shows the URL through `as_uri` here.
        self.can_parse_url = True

    def as_uri(self, uri: str, include_password=False, mask="**") -> str:
        client = self.client
        info = client.info()
        scheme = "rediss" if self.scheme == "redis" and client.ssl else self.scheme
        return as_url(scheme, info["hostname"], info["port"], info["userid"],
                      info["password"] if include_password else mask, quote(info["virtual_host"] or ""),
                      sanitize=not include_password, mask=mask)


class Transport(_Shown, kredis.Transport):
    Channel = Channel


class SentinelTransport(_Shown, kredis.SentinelTransport):
    Channel = SentinelChannel
    scheme = "sentinel"
