"""A fanout subscriber on `drain_events` (Flower's event receiver) hears again after Redis closed its
connection (`workers/intake/transport.py`'s poller), on a real Redis and a real kombu with the fleet's broker options."""
from __future__ import annotations

import socket
import threading
import time

import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from contract.broker.config import broker_url
from workers.intake import transport

EVENTS = Exchange("celeryev", type="fanout")  # Celery's event exchange on Redis: PSUBSCRIBE


def _subscriber_ids(client: redis.Redis) -> list[str]:
    return [c["id"] for c in client.client_list() if c.get("psub") != "0"]


def test_a_subscriber_whose_connection_redis_closed_hears_what_is_published_after(server, client):
    # Given a receiver consuming the event exchange as Flower does (drain_events, no event loop),
    # with the fleet's transport and broker options (a failed read is retried: redis-py reconnects inside it)
    url, options = broker_url(server)
    heard: list[int] = []
    receiver = Connection(url, transport=transport.PATH, transport_options=options)
    Consumer(receiver, [Queue("celeryev.spec", EVENTS, routing_key="#", auto_delete=True)],
             callbacks=[lambda body, _: heard.append(body["n"])], no_ack=True).consume()
    publisher = Producer(Connection(url, transport_options=options))
    stop, published = threading.Event(), []

    def drain() -> None:  # a receiver stuck in a read never returns: it runs beside the test
        while not stop.is_set():
            try:
                receiver.drain_events(timeout=0.2)
            except socket.timeout:
                pass

    def publish(n: int) -> None:
        publisher.publish({"n": n}, exchange=EVENTS, routing_key="worker.heartbeat", declare=[EVENTS])
        published.append(n)

    draining = threading.Thread(target=drain, daemon=True)
    draining.start()
    try:
        _until(lambda: _subscriber_ids(client), "the receiver subscribed")
        publish(0)
        _until(lambda: heard == [0], "the receiver hearing the first event")

        # When Redis closes its subscription (as Sentinel does to every pub/sub client of a
        # primary it demotes), and events go on being published
        for client_id in _subscriber_ids(client):
            client.client_kill_filter(_id=client_id)
        n = 1
        deadline = time.monotonic() + 10
        while not any(h > 0 for h in heard) and time.monotonic() < deadline:
            publish(n)
            n += 1
            time.sleep(0.1)

        # Then it hears them again, on one new subscription
        assert any(h > 0 for h in heard), f"heard {heard} of {published}"
        assert len(_subscriber_ids(client)) == 1
    finally:
        stop.set()
        draining.join(5)
        if not draining.is_alive():
            receiver.release()
        publisher.connection.release()


def _until(predicate, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout}s for {what}"
        time.sleep(0.05)
