"""kombu's take and acknowledgement in few commands (`contract/broker/kombu_take.py`), on a real Redis and a real kombu."""
from __future__ import annotations

import base64
import json
import socket
import time

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

from contract.broker import kombu_redis, kombu_take
from contract.keys import LEASES
from contract.broker.kombu_redis import UNACKED, UNACKED_INDEX
from contract.broker.worker_lease import Holder
from workers.intake import transport

HOLDER = Holder.draw()


def _message(tag: str, body: str = "x") -> dict:
    return {"body": body, "content-encoding": "utf-8", "content-type": "text/plain", "headers": {},
            "properties": {"delivery_tag": tag, "body_encoding": "base64", "priority": 0,
                           "delivery_info": {"exchange": "q", "routing_key": "q"}}}


def test_take_records_what_brpop_took_and_takes_more_oldest_first_each_recorded(client):
    # Given a queue of five messages (kombu pushes on the left, takes on the right)
    for i in range(5):
        client.lpush("q", json.dumps(_message(f"t{i}")))
    first = _message("brpop")

    # When the message BRPOP took is handed over with room for three more
    taken = kombu_take.take(client, ["q"], first, 3, HOLDER)

    # Then the three oldest are taken, in order, and two stay queued
    assert [t.payload["properties"]["delivery_tag"] for t in taken] == ["brpop", "t0", "t1", "t2"]
    assert taken[0].source == "" and all(t.recorded and t.source == "q" for t in taken[1:])
    assert client.llen("q") == 2
    # and each of the four is unacknowledged as kombu records it: [message, exchange, routing key], held
    # under the taking worker's lease, which the take renewed
    for tag in ("brpop", "t0", "t1", "t2"):
        message, exchange, routing_key = json.loads(client.hget(UNACKED, tag))
        assert message["properties"]["delivery_tag"] == tag and (exchange, routing_key) == ("q", "q")
        assert client.zscore(UNACKED_INDEX, tag) == HOLDER.score < 0
    seconds, micros = client.time()  # the lease scored on Redis's own clock, by the script
    assert 0 <= seconds + micros / 1e6 - client.zscore(LEASES, HOLDER.name) < 5


def test_take_follows_brpops_order_of_lists_and_never_takes_past_its_room(client):
    # Given messages on a high-priority list and the plain one
    client.lpush("q\x06\x163", json.dumps(_message("high")))
    client.lpush("q", *[json.dumps(_message(f"low{i}")) for i in range(3)])

    # When there is room for two, none taken by BRPOP
    taken = kombu_take.take(client, ["q", "q\x06\x163"], None, 2, HOLDER)

    # Then the lists are emptied in the order given, two messages in all
    assert [(t.source, t.payload["properties"]["delivery_tag"]) for t in taken] == [("q", "low0"), ("q", "low1")]
    assert client.hlen(UNACKED) == 2 and client.llen("q") == 1 and client.llen("q\x06\x163") == 1


def test_a_message_the_script_cannot_read_is_handed_back_unrecorded_for_kombu_to_judge(client):
    # Given a message without delivery info beside a good one
    odd = {"body": "x", "properties": {"delivery_tag": "odd"}}
    client.lpush("q", json.dumps(odd), json.dumps(_message("good")))

    taken = kombu_take.take(client, ["q"], None, 10, HOLDER)

    assert [(t.payload["properties"]["delivery_tag"], t.recorded) for t in taken] == [("odd", False), ("good", True)]
    assert client.hkeys(UNACKED) == [b"good"]


def test_one_take_is_bounded_whatever_the_room(client):
    client.lpush("q", *[json.dumps(_message(f"m{i}")) for i in range(kombu_take.MOST_PER_TAKE + 50)])
    assert len(kombu_take.take(client, ["q"], None, 10_000, HOLDER)) == kombu_take.MOST_PER_TAKE


def _publisher(connection, queue: Queue):
    """A channel of `connection`, and a function publishing `{"n": n}` to `queue` through it."""
    channel = connection.channel()
    producer = Producer(channel)
    return channel, lambda n: producer.publish({"n": n}, exchange=queue.exchange, routing_key=queue.routing_key,
                                               declare=[queue], serializer="json")


def _consumer(connection, queues: list[Queue], prefetch: int):
    """A consumer of `queues` on a channel of its own, allowed `prefetch` messages, and the list it puts each
    message it gets in."""
    received = []
    consumer = Consumer(connection.channel(), queues, callbacks=[lambda body, message: received.append(message)])
    consumer.qos(prefetch_count=prefetch)
    return consumer, received


@pytest.fixture
def kombu_connection(server):
    """A kombu connection on the worker's transport (selected as Celery's `broker_transport` selects it)."""
    with Connection(server, transport=transport.PATH, transport_options={"visibility_timeout": 3600}) as connection:
        yield connection


def test_a_consumer_gets_every_message_once_each_recorded_and_a_group_commits_ack_skips_kombus(client, kombu_connection):
    # Given ten messages published through kombu, and a consumer allowed to hold six
    queue = Queue("work", Exchange("work", "direct"), routing_key="work")
    publishing, publish = _publisher(kombu_connection, queue)
    for i in range(10):
        publish(i)
    publishing.close()
    consumer, received = _consumer(kombu_connection, [queue], prefetch=6)

    # When it drains what it may hold
    with consumer:
        while len(received) < 6:
            kombu_connection.drain_events(timeout=5)

    # Then it got the oldest six, in order, each unacknowledged in Redis, and four stay queued
    assert [m.payload["n"] for m in received] == list(range(6))
    tags = [m.delivery_tag for m in received]
    assert sorted(k.decode() for k in client.hkeys(UNACKED)) == sorted(tags)
    assert client.zcard(UNACKED_INDEX) == 6 and client.llen("work") == 4

    # When a group commit acknowledges three in its own round trip, then kombu acks all six
    with client.pipeline(transaction=False) as pipe:
        kombu_take.forget(pipe, tags[:3])
        pipe.execute()
    kombu_redis.settled(tags[:3])
    client.hset(UNACKED, tags[0], "written again: kombu's ack of a settled tag must not touch Redis")
    for message in received:
        message.ack()

    # Then the three others were acknowledged by kombu, and a settled tag's ack left Redis alone
    assert client.hkeys(UNACKED) == [tags[0].encode()]
    assert client.zcard(UNACKED_INDEX) == 0
    consumer.channel.close()


def test_a_take_run_again_with_its_token_returns_what_it_recorded_and_takes_nothing_more(client):
    # Given a take of BRPOP's message and three more, whose answer was lost (the script ran)
    client.lpush("q", *[json.dumps(_message(f"t{i}")) for i in range(6)])
    token = kombu_take.new_token()
    first = kombu_take.take(client, ["q"], _message("brpop"), 3, HOLDER, token=token)

    # When one of them is acknowledged meanwhile (never, in a worker: it was not delivered) and the
    # take is run again with its token, as the fail-fast retry or the next channel runs it
    with client.pipeline() as pipe:
        kombu_take.forget(pipe, ["t1"])
        pipe.execute()
    again = kombu_take.take(client, ["q"], _message("brpop"), 3, HOLDER, token=token)

    # Then it returns the same messages as recorded, in order, but the acknowledged one, and took no more
    tags = [t.payload["properties"]["delivery_tag"] for t in first]
    assert tags == ["brpop", "t0", "t1", "t2"]
    assert [(t.source, t.payload["properties"]["delivery_tag"], t.recorded) for t in again] == [
        ("", "brpop", True), ("q", "t0", True), ("q", "t2", True)]
    assert again[1].payload == first[1].payload
    assert client.llen("q") == 3 and client.hlen(UNACKED) == 3
    assert {client.zscore(UNACKED_INDEX, t) for t in ("brpop", "t0", "t2")} == {HOLDER.score}

    # and a new take (a new token) takes on from the queue
    assert [t.payload["properties"]["delivery_tag"] for t in kombu_take.take(
        client, ["q"], None, 1, HOLDER, token=kombu_take.new_token())] == ["t3"]


def test_a_take_whose_script_never_ran_runs_whole_with_its_token(client):
    client.lpush("q", json.dumps(_message("t0")))
    taken = kombu_take.take(client, ["q"], _message("brpop"), 5, HOLDER, token=kombu_take.new_token())
    assert [t.payload["properties"]["delivery_tag"] for t in taken] == ["brpop", "t0"]


def test_takes_of_two_threads_side_by_side_each_read_back_their_own(client):
    # Given two threads of one worker each taking (Flower's remote-control replies take beside its events)
    client.lpush("q", *[json.dumps(_message(f"t{i}")) for i in range(4)])
    a, b = kombu_take.new_token(), kombu_take.new_token()
    first_a = kombu_take.take(client, ["q"], None, 2, HOLDER, token=a, lane="A")
    kombu_take.take(client, ["q"], None, 2, HOLDER, token=b, lane="B")

    # When the first one's answer was lost and it runs again with its token
    again = kombu_take.take(client, ["q"], None, 2, HOLDER, token=a, lane="A")

    # Then it gets its own two back, not the other thread's
    assert [t.payload for t in again] == [t.payload for t in first_a]
    assert [t.payload["properties"]["delivery_tag"] for t in again] == ["t0", "t1"]


def _drain(connection, seconds: float) -> None:
    """The consumer's event loop for a while (kombu sends, pauses and reads BRPOPs as it runs)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            connection.drain_events(timeout=0.2)
        except socket.timeout:
            pass


def test_a_message_brpop_took_as_the_consumers_room_ran_out_goes_back_to_the_head_of_its_queue(client,
                                                                                                kombu_connection):
    # Given a consumer allowed two messages, holding one, whose next BRPOP waits on the empty queue
    queue = Queue("work", Exchange("work", "direct"), routing_key="work")
    publishing, publish = _publisher(kombu_connection, queue)
    publish(0)
    consumer, received = _consumer(kombu_connection, [queue], prefetch=2)
    with consumer:
        _drain(kombu_connection, 0.5)
        assert [m.payload["n"] for m in received] == [0]

        # When its room shrinks to what it holds (the gate lowered its prefetch) and a message comes meanwhile
        consumer.qos(prefetch_count=1)
        publish(1)
        _drain(kombu_connection, 2.0)

        # Then BRPOP's message is back at the head of its queue, not kept in the consumer's socket (out of Redis)
        assert client.llen("work") == 1 and received[1:] == [] and client.hlen(UNACKED) == 1
        # and it is delivered once the room returns
        consumer.qos(prefetch_count=2)
        _drain(kombu_connection, 1.0)
    assert [m.payload["n"] for m in received] == [0, 1] and client.llen("work") == 0
    publishing.close()


def test_a_message_brpop_took_for_a_queue_no_longer_consumed_goes_back_to_the_head_of_its_queue(client,
                                                                                                 kombu_connection):
    # Given a consumer of two queues whose BRPOP waits on both, empty
    queues = [Queue(name, Exchange(name, "direct"), routing_key=name) for name in ("work", "other")]
    publishing, publish = _publisher(kombu_connection, queues[0])
    consumer, received = _consumer(kombu_connection, queues, prefetch=4)
    with consumer:
        _drain(kombu_connection, 0.5)

        # When it stops consuming one of them (the gate, its servers gone) as a message comes there, then another
        consumer.cancel_by_queue("work")
        publish(1)
        publish(2)
        _drain(kombu_connection, 2.0)

        # Then the first is back at the head of its queue, before the second, never delivered nor recorded
        queued = [json.loads(base64.b64decode(json.loads(m)["body"]))["n"] for m in client.lrange("work", 0, -1)]
        assert queued == [2, 1] and received == [] and client.hlen(UNACKED) == 0
    publishing.close()


@pytest.mark.parametrize("ended", ["killed", "unblocked"])
def test_a_paused_brpop_ended_by_redis_leaves_the_consumer_running_and_taking_messages(client, kombu_connection, ended):
    # Given a consumer allowed two messages, holding one, whose BRPOP was paused when its room shrank to what it holds
    queue = Queue("work", Exchange("work", "direct"), routing_key="work")
    publishing, publish = _publisher(kombu_connection, queue)
    publish(0)
    consumer, received = _consumer(kombu_connection, [queue], prefetch=2)
    with consumer:
        _drain(kombu_connection, 0.3)
        consumer.qos(prefetch_count=1)
        _drain(kombu_connection, 0.05)

        # When Redis ends that BRPOP: its connection killed (a restart, Sentinel's CLIENT KILL), or the BRPOP
        # unblocked with an error reply (UNBLOCKED, as for a primary demoted under it)
        [blocked] = [c for c in client.client_list() if c["cmd"] == "brpop"]
        if ended == "killed":
            client.client_kill_filter(_id=blocked["id"])
        else:
            client.execute_command("CLIENT", "UNBLOCK", blocked["id"], "ERROR")
        time.sleep(0.1)
        _drain(kombu_connection, 0.6)  # the consumer's loop raises nothing

        # Then once its room returns, the next message is delivered
        consumer.qos(prefetch_count=2)
        publish(1)
        _drain(kombu_connection, 1.5)
    assert [m.payload["n"] for m in received] == [0, 1]
    publishing.close()
