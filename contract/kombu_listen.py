"""A fanout subscriber that kombu polls without an event loop hears again after Redis closed its connection.

Flower's event receiver (`flower.events.Events` -> Celery's `EventReceiver`
-> `Connection.drain_events`) reads worker events from a Redis pub/sub
subscription (kombu's fanout exchange is PSUBSCRIBE). Without an event loop,
kombu's `MultiChannelPoller` registers the subscription's socket with its
poller once and, before each poll, asks `_client_registered` only whether the
client has a socket and a registration, not whether that registration is
this socket. The fleet's broker connections retry a failed read
(`retry_on_timeout`, `contract/broker.py`), so when Redis closes the
subscription, redis-py reconnects inside kombu's read (behind Sentinel, to
the primary the Sentinels name now) and subscribes again on a new socket that
kombu never polls: the receiver hears nothing more and raises nothing, so
Flower's own reconnect loop never runs. Sentinel closes every pub/sub client
of a primary it demotes (`CLIENT KILL TYPE pubsub`, with the normal ones): after
every `SENTINEL FAILOVER`, and when a frozen primary resumes. A plain
`REPLICAOF` keeps them, and a demoted primary still relays what the new one
publishes, so only the closed connection leaves the receiver deaf.

`follow_reconnects` makes `_client_registered` also compare the registered
socket with the client's socket of now: a replaced one is registered again
and subscribed again (kombu's own `_register_LISTEN`; a second PSUBSCRIBE of
a pattern is a no-op in Redis). The worker's event loop already drops a
closed connection's registration (kombu's `register_with_event_loop`), so
there the check changes nothing. Read from kombu 5.7.0's
`kombu/transport/redis.py` (`MultiChannelPoller._client_registered`,
`_chan_to_sock`, `_register_LISTEN`); `problems` lists what an upgrade moved
(`kombu_redis.check`).
"""
from __future__ import annotations

from . import patches


def follow_reconnects() -> None:
    """A subscription whose connection redis-py replaced subscribes again and is polled again.
    Idempotent."""
    from kombu.transport import redis as kredis
    from redis.client import PubSub

    def resubscribing(registered):
        def _client_registered(self, channel, client, cmd):
            found = registered(self, channel, client, cmd)  # takes the client's connection if it has none
            if isinstance(client, PubSub):  # redis-py's own resubscribe, on every reconnect
                client.connection.register_connect_callback(client.on_connect)
            return found and self._chan_to_sock.get((channel, client, cmd)) is client.connection._sock
        return _client_registered

    patches.replace(kredis.MultiChannelPoller, "_client_registered", resubscribing)


def problems() -> list[str]:
    """What `follow_reconnects` relies on that this kombu no longer has."""
    from kombu.transport import redis as kredis

    poller = getattr(kredis, "MultiChannelPoller", None)
    found = [name for name in ("_client_registered", "_register_LISTEN", "_register")
             if not callable(getattr(poller, name, None))]
    init = getattr(getattr(poller, "__init__", None), "__code__", None)
    if init is None or "_chan_to_sock" not in init.co_names:
        found.append("_chan_to_sock")
    return [f"kombu.transport.redis.MultiChannelPoller.{name} is gone" for name in found]
