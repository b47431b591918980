"""The worker's kombu transport and heartbeat step (`workers/intake/transport.py`,
`workers/reporting/heart.py`): selected through kombu's and Celery's own settings, on a real Redis."""
from __future__ import annotations

import json
from types import SimpleNamespace

from celery.worker.consumer import Consumer
from kombu import Connection
from kombu.utils.json import dumps

from workers.intake import transport
from workers.intake.consumer import FleetConsumer
from workers.intake.recent import ACKED
from workers.reporting import heart


def test_celerys_broker_transport_setting_selects_the_workers_transport_plain_or_behind_sentinel():
    assert transport.transport_for("redis://h:6380/0") == transport.PATH
    assert transport.transport_for("sentinel://h1:26379/0;sentinel://h2:26379/0") == transport.SENTINEL_PATH
    assert Connection("redis://h:1/0", transport=transport.PATH).get_transport_cls() is transport.Transport
    sentinel = Connection("sentinel://h1:26379/0;sentinel://h2:26379/0", transport=transport.SENTINEL_PATH,
                          failover_strategy=transport.keep_transport)
    assert sentinel.get_transport_cls() is transport.SentinelTransport
    assert transport.SentinelTransport.Channel.QoS is transport.SentinelQoS


def test_a_failed_connect_behind_sentinel_keeps_the_workers_transport():
    # Given a connection to two Sentinels on the worker's transport
    connection = Connection("sentinel://h1:26379/0;sentinel://h2:26379/0", transport=transport.SENTINEL_PATH,
                            failover_strategy=transport.keep_transport)

    # When kombu moves on to the next host after a failed connect (as ensure_connection does)
    connection.maybe_switch_next()
    connection.maybe_switch_next()

    # Then the transport is still the worker's (kombu's own switch would parse the URL's scheme back)
    assert connection.get_transport_cls() is transport.SentinelTransport
    assert (connection.hostname, connection.port) == ("h1", 26379)
    # and the connection's description still encodes as JSON (`celery inspect stats` sends it)
    assert json.loads(dumps(connection.info()))["failover_strategy"] == transport.keep_transport.NAME


def test_the_transport_builds_its_own_poller(server):
    with Connection(server, transport=transport.PATH) as connection:
        assert type(connection.transport.cycle) is transport.MultiChannelPoller


def test_behind_sentinel_a_reject_without_requeue_is_remembered_for_a_failover_as_an_ack_is(server, client):
    # Given a Sentinel channel's QoS holding two deliveries (the QoS of a plain channel remembers nothing)
    with Connection(server, transport=transport.PATH) as connection:
        channel = connection.channel()
        qos = transport.SentinelQoS(channel, prefetch_count=10)
        for tag in ("acked-1", "rejected-1", "requeued-1"):
            qos._delivered[tag] = SimpleNamespace(delivery_tag=tag)

        # When one is acknowledged, one rejected for good and one rejected with requeue
        qos.ack("acked-1")
        qos.reject("rejected-1", requeue=False)
        qos.reject("requeued-1", requeue=True)
        channel.close()

    # Then the first two are sent again on a new primary (`failover.py`), the requeued one is not
    remembered = set(ACKED.items())
    assert {"acked-1", "rejected-1"} <= remembered and "requeued-1" not in remembered


def test_the_consumer_runs_the_fleets_heartbeat_step_in_place_of_celerys():
    steps = FleetConsumer.Blueprint.default_steps
    assert heart.STEP in steps and heart.CELERY_STEP not in steps
    assert len(steps) == len(Consumer.Blueprint.default_steps)


def test_a_heartbeat_is_sent_once_never_retried():
    sent = []
    eventer = SimpleNamespace(enabled=True, on_enabled=set(), on_disabled=set(),
                              send=lambda event, **fields: sent.append((event, fields["retry"])))
    beat = heart.Heartbeat(timer=None, eventer=eventer, interval=10)
    beat._send("worker-heartbeat")
    beat._send("worker-online", retry=True)
    assert sent == [("worker-heartbeat", False), ("worker-online", False)]


def test_a_connection_on_the_workers_transport_is_shown_as_kombus_own_redis_url_is():
    # (Celery's banner, Flower's log and its broker page read `as_uri`: a redis:// URL, its password masked)
    for url in ("redis://:secret@127.0.0.1:6390/0", "redis://127.0.0.1:6390/3"):
        ours, kombus = Connection(url, transport=transport.PATH), Connection(url)
        assert ours.as_uri() == kombus.as_uri()
        assert ours.as_uri(include_password=True) == kombus.as_uri(include_password=True)
    assert Connection("rediss://:pw@h:6390/0", transport=transport.PATH,
                      ssl={"ssl_cert_reqs": 2}).as_uri() == "rediss://:**@h:6390/0"
    url = "sentinel://:pw@h1:26379/0;sentinel://:pw@h2:26379/0"
    assert Connection(url, transport=transport.SENTINEL_PATH).as_uri() == Connection(url).as_uri()
