"""Broker faults, in process: what a detached channel keeps, what a lease keeper renews, what a
message names. The real-process tests are tests/intake/test_broker_faults.py."""
from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import pytest
from kombu.transport import redis as kombu_redis_transport
from kombu.transport.virtual import base

from contract import kombu_redis
from workers.intake.consumer import prompt_of
from workers.intake.lease import Leases, hold_limit
from workers.settings import Settings


def _qos_holding(*tags: str):
    """kombu's own Redis QoS, holding deliveries as its channel's consumer would have appended them."""
    qos = kombu_redis_transport.QoS(SimpleNamespace(do_restore=True), prefetch_count=10)
    for tag in tags:
        base.QoS.append(qos, SimpleNamespace(delivery_tag=tag), tag)
    return qos


def test_the_kombu_and_celery_internals_the_fleet_reads_are_where_it_reads_them():
    assert kombu_redis.check() == []
    kombu_redis.require()  # and the worker starts


def test_a_worker_refuses_to_start_on_a_kombu_or_celery_whose_internals_moved(monkeypatch):
    # Given an upgrade that moved the unacked index's restore, the QoS's dirty set and the
    # event dispatcher's buffer
    from celery.events.dispatcher import EventDispatcher

    monkeypatch.delattr(kombu_redis_transport.QoS, "restore_by_tag")
    monkeypatch.setattr(base.QoS, "__init__", _dirty_as_list(base.QoS.__init__))
    monkeypatch.setattr(EventDispatcher, "__init__", _without_outbound_buffer(EventDispatcher.__init__))

    # Then the check names each, and the worker's start says which versions are installed
    assert kombu_redis.check() == [
        "kombu.transport.redis.QoS.restore_by_tag is gone",
        "kombu.transport.virtual.base.QoS has no _dirty set",
        "celery's EventDispatcher has no _outbound_buffer",
    ]
    with pytest.raises(RuntimeError) as refused:
        kombu_redis.require()
    import celery
    import kombu
    import redis

    assert f"celery {celery.__version__}, kombu {kombu.__version__}, redis-py {redis.__version__}" in str(refused.value)
    assert "restore_by_tag" in str(refused.value) and "read from 5.7.0" in str(refused.value)


def _dirty_as_list(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._on_collect.cancel()  # no restore at exit for this stand-in of a changed QoS
        self._dirty = list(self._dirty)
    return __init__


def _without_outbound_buffer(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._pending = self.__dict__.pop("_outbound_buffer")
    return __init__


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
    assert type(qos) is kind
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
    leases = Leases(None, limit=1000, lease_seconds=100, clock=lambda: 0.0)
    ab = ["a", "b"]
    assert leases.decide(ab, ab, ab, set()) == (set(), ["a", "b"], set())
    assert leases.decide(ab, ab, ab, {"a"}) == (set(), ["a", "b"], set())  # its ack may be on its way
    assert leases.decide(ab, ["b"], ["b"], set()) == (set(), ["b"], set())  # "a" not due: not checked
    assert leases.decide(ab, ab, ["b"], set()) == (set(), ["a", "b"], set())  # "a" due, running: not checked
    assert leases.decide(ab, ab, ab, {"a"}) == ({"a"}, ["b"], set())


def test_a_delivery_finished_at_one_check_and_not_the_next_is_kept():
    leases = Leases(None, limit=1000, lease_seconds=100, clock=lambda: 0.0)
    leases.decide(["a"], ["a"], ["a"], {"a"})
    assert leases.decide(["a"], ["a"], ["a"], set()) == (set(), ["a"], set())
    assert leases.decide(["a"], ["a"], ["a"], {"a"}) == (set(), ["a"], set())


def test_no_lease_is_renewed_past_the_hold_limit():
    now = [0.0]
    leases = Leases(None, limit=10, lease_seconds=100, clock=lambda: now[0])
    assert leases.decide(["a"], ["a"], [], set()) == (set(), ["a"], set())
    now[0] = 8.0
    assert leases.decide(["a", "b"], ["a", "b"], [], set()) == (set(), ["a", "b"], set())
    now[0] = 11.0
    assert leases.decide(["a", "b"], ["a", "b"], [], set()) == (set(), ["b"], {"a"})
    now[0] = 12.0
    assert leases.decide(["a", "b"], ["a", "b"], [], set()) == (set(), ["b"], set())  # said once, never again
    assert leases.decide(["b"], ["b"], [], set()) == (set(), ["b"], set())


def test_every_lease_is_due_in_a_keepers_first_round():
    leases = Leases(None, limit=1000, lease_seconds=120)
    assert leases.due(["a", "b"], at=1_000.0) == ["a", "b"]


def test_a_live_workers_lease_is_never_more_than_half_run_out():
    # Given a 120 s lease: rounds every 15 s, a lease due when it would be 60 s old by the next
    leases = Leases(None, limit=1000, lease_seconds=120)
    assert leases.period == 15.0
    leases.renewed(leases.due(["a"], at=0.0), at=0.0)
    # Then it is left alone for two rounds...
    assert [leases.due(["a"], at=t) for t in (15.0, 30.0)] == [[], []]
    # ...and due from the third on until renewed: 45 s old, then 60, 75, 90, 105 when rounds fail,
    # so it lapses (120 s) only after half a lease of failed rounds
    assert [leases.due(["a"], at=t) for t in (45.0, 60.0, 75.0, 90.0, 105.0)] == [["a"]] * 5
    leases.renewed(["a"], at=45.0)
    assert leases.due(["a"], at=75.0) == []
    assert leases.interval == 45.0  # held throughout, renewed every third round


def test_a_delivery_first_seen_is_taken_as_scored_a_round_before_the_previous_round():
    # Given a keeper whose previous round ran at 1,000 s (rounds every 15 s)
    leases = Leases(None, limit=1000, lease_seconds=120)
    leases.renewed(leases.due(["old"], at=1_000.0), at=1_000.0)
    # When a delivery it never saw is held at the next round: taken after the previous round read
    # what was held, so scored at 985 s at the earliest (a round trip within a round's margin)
    assert leases.due(["old", "new"], at=1_015.0) == []
    # Then it is due once it would be 60 s past that earliest score by the next round, a round
    # before the one renewed at 1,000 s
    assert leases.due(["old", "new"], at=1_030.0) == ["new"]
    assert leases.due(["old", "new"], at=1_045.0) == ["old", "new"]


def test_every_channel_hands_out_the_workers_shared_client_for_its_short_calls():
    # Given kombu's Redis channels with the worker's shared client (no connection is opened)
    original = kombu_redis_transport.Channel._create_client
    shared = SimpleNamespace(name="the worker's client")
    try:
        kombu_redis.share_client(lambda: shared)
        kombu_redis.share_client(lambda: shared)  # idempotent: kombu's own builder stays underneath
        channels = [object.__new__(kombu_redis_transport.Channel) for _ in range(2)]
        built = []
        for channel in channels:
            channel.__dict__["_async_pool"] = None
            channel._get_pool = lambda asynchronous=False: built.append(asynchronous) or SimpleNamespace(
                connection_kwargs={})
            channel.Client = lambda connection_pool, **_: SimpleNamespace(connection_pool=connection_pool)

        # When each serves appends and acks, and the event loop asks for its blocking client
        short = [channel._create_client() for channel in channels for _ in range(3)]
        blocking = channels[0]._create_client(asynchronous=True)

        # Then every short call got the one shared client, no pool of kombu's was built for them,
        # and the blocking fetch still gets a client on kombu's own asynchronous pool
        assert all(client is shared for client in short)
        assert blocking is not shared and built == [True]
    finally:
        kombu_redis_transport.Channel._create_client = original
