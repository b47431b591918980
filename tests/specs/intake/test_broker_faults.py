"""Broker faults, in process: what a detached channel keeps, what a lease keeper renews, what a
message names. The real-process tests are tests/intake/test_broker_faults.py."""
from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.transport.virtual import base

from contract.broker import kombu_redis
from workers.intake import redis_pool, transport
from workers.intake.consumer import prompt_of
from workers.intake.lease import Leases, hold_limit, round_period
from workers.settings import Settings


def _qos_holding(*tags: str):
    """The worker transport's QoS, holding deliveries as its channel's consumer would have appended them."""
    qos = transport.QoS(SimpleNamespace(do_restore=True), prefetch_count=10)
    for tag in tags:
        base.QoS.append(qos, SimpleNamespace(delivery_tag=tag), tag)
    return qos


def test_a_detached_channel_restores_nothing_when_it_closes_and_settles_through_the_fleet():
    # Given a channel holding two deliveries, detached as a lost connection closes it
    qos = _qos_holding("t1", "t2")
    acked, requeued = [], []
    assert kombu_redis.detach(SimpleNamespace(_qos=qos), acked.append, requeued.append) is qos

    # When kombu closes the channel (its channel has no restore to call: calling one would raise)
    qos.restore_unacked_once()

    # Then both deliveries are still held, and an ack and a requeue go to the fleet, by tag
    assert set(kombu_redis.held(qos)) == {"t1", "t2"}
    qos.ack("t1")
    qos.reject("t2", requeue=True)
    assert (acked, requeued) == (["t1"], ["t2"])
    assert kombu_redis.held(qos) == {}


def test_a_channel_detached_twice_keeps_its_settlement():
    qos = _qos_holding("t1")
    acked: list[str] = []
    kombu_redis.detach(SimpleNamespace(_qos=qos), acked.append, acked.append)
    kind = type(qos)
    kombu_redis.detach(SimpleNamespace(_qos=qos), acked.append, acked.append)
    assert type(qos) is kind is transport.QoS  # no class swapped
    qos.reject("t1")
    assert acked == ["t1"]


def test_a_channel_that_never_consumed_has_nothing_to_detach():
    assert kombu_redis.detach(SimpleNamespace(_qos=None), print, print) is None


def test_a_fleet_message_names_its_run_and_prompt():
    body = json.dumps([["default", "p-0001", 512], {}, {"callbacks": None}])
    assert prompt_of(SimpleNamespace(body=body)) == ("default", "p-0001")
    assert prompt_of(SimpleNamespace(body=body.encode())) == ("default", "p-0001")
    assert prompt_of(SimpleNamespace(body="not json")) == (None, None)
    assert prompt_of(SimpleNamespace(body=json.dumps([[], {}, {}]))) == (None, None)


def test_a_held_delivery_is_renewed_until_its_prompt_is_finished_at_two_checks_in_a_row():
    leases = Leases(None, limit=1000, lease_seconds=120.0, clock=lambda: 0.0)
    ab = ["a", "b"]
    assert leases.decide(ab, ab, set()) == (set(), ["a", "b"], set())
    assert leases.decide(ab, ab, {"a"}) == (set(), ["a", "b"], set())  # its ack may be on its way
    assert leases.decide(ab, ["b"], set()) == (set(), ["a", "b"], set())  # "a" running: renewed, not checked
    assert leases.decide(ab, ab, {"a"}) == ({"a"}, ["b"], set())


def test_a_delivery_finished_at_one_check_and_not_the_next_is_kept():
    leases = Leases(None, limit=1000, lease_seconds=120.0, clock=lambda: 0.0)
    leases.decide(["a"], ["a"], {"a"})
    assert leases.decide(["a"], ["a"], set()) == (set(), ["a"], set())
    assert leases.decide(["a"], ["a"], {"a"}) == (set(), ["a"], set())


def test_no_lease_is_renewed_past_the_hold_limit():
    now = [0.0]
    leases = Leases(None, limit=10, lease_seconds=120.0, clock=lambda: now[0])
    assert leases.decide(["a"], [], set()) == (set(), ["a"], set())
    now[0] = 8.0
    assert leases.decide(["a", "b"], [], set()) == (set(), ["a", "b"], set())
    now[0] = 11.0
    assert leases.decide(["a", "b"], [], set()) == (set(), ["b"], {"a"})
    now[0] = 12.0
    assert leases.decide(["a", "b"], [], set()) == (set(), ["b"], set())  # said once, never again
    assert leases.decide(["b"], [], set()) == (set(), ["b"], set())


def test_a_live_workers_lease_lapses_only_after_three_quarters_of_a_lease_without_rounds():
    # Given a 120 s lease: rounds every 30 s, and deliveries taken between them ("a" at 0 s,
    # "b" at 10 s, "c" at 65 s), some running here and some not
    lease_seconds = 120.0
    period = round_period(lease_seconds)
    leases = Leases(None, limit=1000, lease_seconds=120.0, clock=lambda: 0.0)
    taken = {"a": 0.0, "b": 10.0, "c": 65.0}
    score = dict(taken)
    oldest_before_a_round = 0.0
    # When rounds keep time, each renewing what it decides to renew at its own time
    for at in (period * k for k in range(1, 6)):
        held = [tag for tag, t in taken.items() if t < at]
        oldest_before_a_round = max([oldest_before_a_round] + [at - score[tag] for tag in held])
        _, live, _ = leases.decide(held, [t for t in held if t != "a"], set())
        score.update({tag: at for tag in live})
        # Then every held delivery was renewed, so none is older than this round after it
        assert sorted(live) == sorted(held)
    # and none was ever more than a quarter lease old: with rounds failing from any moment on, a
    # lease lapses only after lease - period = 3/4 of a lease (90 s) without a round
    assert period == lease_seconds / 4 and oldest_before_a_round <= period
    assert lease_seconds - oldest_before_a_round >= 3 * lease_seconds / 4


@pytest.fixture
def shared_for(server):
    """The worker's shared client configured for `server`, as its entry point configures it; reset after."""
    redis_pool.configure(redis_pool.DEFAULT_CONNECTIONS, server)
    yield redis_pool.shared()
    redis_pool.configure(redis_pool.DEFAULT_CONNECTIONS, None)


def test_every_channel_hands_out_the_workers_shared_client_for_its_short_calls(server, shared_for):
    # Given two channels of the worker's transport, in a process whose shared client is configured
    with Connection(server, transport=transport.PATH) as connection:
        channels = [connection.channel() for _ in range(2)]

        # When each serves appends and acks, and the event loop asks for its blocking client
        short = [channel._create_client() for channel in channels for _ in range(3)]

        # Then every short call got the one shared client, and the blocking fetch still gets a client
        # on kombu's own asynchronous pool
        assert all(client is shared_for for client in short)
        assert all(channel.client is not shared_for for channel in channels)
        assert channels[0].client.connection_pool is channels[0].async_pool


def test_a_new_channel_checks_redis_on_the_shared_client_and_opens_no_connection_for_it(server, shared_for):
    # Given the worker's shared client, connected, and the worker's transport handing it out
    observer = redis.Redis.from_url(server)
    shared_for.ping(), observer.ping()
    with Connection(server, transport=transport.PATH) as connection:
        connection.connect()
        received = observer.info("stats")["total_connections_received"]

        # When threads that publish open channels (kombu's producer pool, its channels busy)
        channels = [connection.channel() for _ in range(3)]

        # Then Redis saw no new connection for their checks of it (a fifth, for a moment, before)
        assert observer.info("stats")["total_connections_received"] == received
        # and an event one of them publishes reaches a subscriber (the same fanout topic, `/0.`)
        events = Exchange("events", type="fanout")
        heard: list = []
        with Connection(server) as listening:
            consumer = Consumer(listening.channel(), [Queue("flower", events, auto_delete=True)],
                                callbacks=[lambda body, message: heard.append(body)], accept=["json"])
            with consumer:
                with contextlib.suppress(TimeoutError):  # the subscription starts with the first poll
                    listening.drain_events(timeout=0.2)
                Producer(channels[0], exchange=events).publish({"type": "worker-online"}, serializer="json")
                with contextlib.suppress(TimeoutError):
                    listening.drain_events(timeout=5)
        assert heard == [{"type": "worker-online"}]
        # and each channel's blocking client is still its own, for BRPOP
        assert all(channel.client is not shared_for for channel in channels)


def test_a_broker_url_or_options_the_shared_client_cannot_honour_are_refused_at_start():
    assert transport.refusal("redis://127.0.0.1:1/0", {"visibility_timeout": 5}) is None
    assert "global_keyprefix is not supported" in transport.refusal("redis://h/0", {"global_keyprefix": "x:"})
    assert "credential_provider is not supported" in transport.refusal(
        "redis://h/0?credential_provider=redis.CredentialProvider", {})
    assert "credential_provider is not supported" in transport.refusal(
        "sentinel://h1:26379/0;sentinel://h2:26379/0?credential_provider=x.Y", {})
