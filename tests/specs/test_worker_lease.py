"""One lease per worker process (`contract/broker/worker_lease.py`), on a real Redis and kombu's real sweep."""
from __future__ import annotations

import pytest
from kombu import Connection, Exchange, Producer, Queue

from contract.broker import kombu_take, worker_lease
from contract.redis_link.clock import CLOCK
from contract.keys import LEASES
from contract.broker.kombu_redis import UNACKED, UNACKED_INDEX
from contract.broker.worker_lease import Holder
from workers.intake import transport
from workers.intake.lease import Leases
from workers.intake.consumer import Delivery

LEASE = 120.0
QUEUE = Queue("work", Exchange("work", "direct"), routing_key="work")


@pytest.fixture
def kombu(server, client):
    """A connection on the worker's transport whose sweep restores what lapsed a second ago, and a channel on it."""
    with Connection(server, transport=transport.PATH, transport_options={"visibility_timeout": 1}) as connection:
        channel = connection.channel()
        yield channel
        channel.close()


def publish(channel, n: int) -> None:
    producer = Producer(channel)
    for i in range(n):
        producer.publish({"n": i}, exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE], serializer="json")


def take(client, holder: Holder, n: int, at: float) -> list[str]:
    """Tags of `n` messages taken from the queue by `holder`, as a worker's take records them, its
    lease last renewed at `at` (the take renews it on Redis's clock: dated back here)."""
    tags = [t.payload["properties"]["delivery_tag"] for t in kombu_take.take(client, ["work"], None, n, holder)]
    client.zadd(LEASES, {holder.name: at})
    return tags


def sweep(channel) -> None:
    """kombu's own restore sweep, as each live worker runs it every restore interval."""
    channel.qos.restore_visible(num=500, interval=1)


def test_a_live_workers_deliveries_are_never_restored_by_kombus_sweep_however_old(client, kombu):
    # Given a worker that took three messages an hour ago and renews its lease
    publish(kombu, 3)
    now, worker = CLOCK.now(client), Holder.draw()
    take(client, worker, 3, now - 3600)
    worker_lease.renew(client, worker, now, LEASE)

    # When kombu's sweep runs (its cut-off is a second ago)
    sweep(kombu)

    # Then nothing is restored: the deliveries are held, the queue empty
    assert client.hlen(UNACKED) == 3 and client.llen("work") == 0


def test_a_dead_workers_deliveries_are_handed_to_the_sweep_by_a_live_workers_round_and_restored_once(client, kombu):
    # Given a worker that took three messages and then died, its lease a whole lease old, and a live worker
    publish(kombu, 5)
    now, dead, live = CLOCK.now(client), Holder.draw(), Holder.draw()
    take(client, dead, 3, now - LEASE - 1)
    mine = take(client, live, 2, now)
    sweep(kombu)
    assert client.llen("work") == 0  # nothing lapsed yet

    # When the live worker's round runs
    found = worker_lease.renew(client, live, now, LEASE)

    # Then it hands the dead worker's three to the sweep and forgets that worker's lease
    assert found == worker_lease.Round(missing=False, reaped=3)
    assert client.zscore(LEASES, dead.name) is None
    # and the sweep puts those three back on the queue, once, keeping the live worker's
    sweep(kombu)
    sweep(kombu)
    assert client.llen("work") == 3
    assert sorted(k.decode() for k in client.hkeys(UNACKED)) == sorted(mine)


def test_a_round_hands_back_a_page_at_a_time_and_keeps_the_lease_until_its_last_delivery(client, kombu):
    # Given a dead worker that held five deliveries
    publish(kombu, 5)
    now, dead, live = CLOCK.now(client), Holder.draw(), Holder.draw()
    take(client, dead, 5, now - LEASE - 1)

    # When live rounds hand back two at most each
    reaped = [worker_lease.renew(client, live, now, LEASE, page=2).reaped for _ in range(4)]

    # Then it takes three rounds, and the dead worker's lease goes with its last delivery
    assert reaped == [2, 2, 1, 0]
    assert client.zscore(LEASES, dead.name) is None
    assert client.zcount(UNACKED_INDEX, 0, 0) == 5


def test_an_acknowledged_delivery_is_never_resurrected_by_a_round(client, kombu):
    # Given a dead worker whose one delivery was acknowledged (its sample stored) before it died
    publish(kombu, 1)
    now, dead, live = CLOCK.now(client), Holder.draw(), Holder.draw()
    tags = take(client, dead, 1, now - LEASE - 1)
    with client.pipeline() as pipe:
        kombu_take.forget(pipe, tags)
        pipe.execute()

    # When a live round hands the dead worker's deliveries back
    assert worker_lease.renew(client, live, now, LEASE).reaped == 0

    # Then nothing comes back
    assert client.zcard(UNACKED_INDEX) == 0 and client.hlen(UNACKED) == 0
    assert client.zscore(LEASES, dead.name) is None


def test_a_worker_that_froze_past_its_lease_takes_back_what_the_sweep_has_not_restored(client, kombu):
    # Given a worker frozen past its lease, whose three deliveries another worker handed to the sweep
    publish(kombu, 3)
    now, frozen, live = CLOCK.now(client), Holder.draw(), Holder.draw()
    tags = take(client, frozen, 3, now - LEASE - 1)
    worker_lease.renew(client, live, now, LEASE)
    # and the sweep restored one of them before the worker thawed
    kombu.qos.restore_by_tag(tags[0])

    # When it thaws: its round finds its lease gone, and takes back what it still holds
    found = worker_lease.renew(client, frozen, now, LEASE)
    assert found.missing
    assert worker_lease.reclaim(client, frozen, now, tags) == 2

    # Then the two are its own again, out of the sweep's reach, and the restored one waits on the queue
    sweep(kombu)
    assert [client.zscore(UNACKED_INDEX, t) for t in tags] == [None, frozen.score, frozen.score]
    assert client.llen("work") == 1


def test_lapsing_says_when_the_sweep_will_bring_something_back(client):
    # Given a worker whose lease was renewed a quarter lease ago
    holder = Holder.draw()
    client.zadd(LEASES, {holder.name: 1000.0 - 30.0})
    client.zadd(UNACKED_INDEX, {"held": holder.score})
    assert not worker_lease.lapsing(client, 1000.0, LEASE / 2)
    # When it goes half a lease without a round, or a delivery is handed back, something will come back
    assert worker_lease.lapsing(client, 1000.0 + 31.0, LEASE / 2)
    client.zadd(LEASES, {holder.name: 1000.0})
    client.zadd(UNACKED_INDEX, {"handed back": 0.0})
    assert worker_lease.lapsing(client, 1000.0, LEASE / 2)


def sent(client) -> tuple[dict[str, int], int]:
    """Calls of each command since the stats were reset, and the bytes Redis read meanwhile; but the
    clock's TIME reads, which a slow round trip (a loaded machine) repeats whatever a round holds
    (`contract/redis_link/clock.py` keeps the shortest of a few), with the 14 bytes each sends."""
    calls = {name: stats["calls"] for name, stats in client.info("commandstats").items()}
    times = calls.pop("cmdstat_time", 0)
    return calls, client.info("stats")["total_net_input_bytes"] - 14 * times


@pytest.mark.parametrize("generating, sizes", [(True, (1, 256)), (False, (64, 512))])
def test_a_lease_round_sends_the_same_redis_work_whatever_the_worker_holds(client, generating, sizes):
    # Given two workers, one holding more deliveries than the other (generating them, or waiting
    # for a thread, when a round reads a slice of their prompts' states)
    def delivery(worker: int, i: int) -> Delivery:
        return Delivery(f"w{worker}-{i:03d}", None, "run", f"p{i}")

    cost = []
    for worker, held in enumerate(sizes):
        holder = Holder.draw()
        deliveries = {d.tag: d for d in (delivery(worker, i) for i in range(held))}
        client.zadd(UNACKED_INDEX, dict.fromkeys(deliveries, holder.score))
        leases = Leases(client, limit=1e9, lease_seconds=LEASE, running=lambda d: generating, holder=holder)
        leases.round(deliveries)  # the first round (the clock, the scripts loaded)

        # When each runs a round
        client.config_resetstat()
        leases.round(deliveries)
        cost.append(sent(client))

    # Then both sent the same commands, as many of each, and as many bytes (but for the digits of
    # their lease holders' numbers)
    (calls, read), (more_calls, more_read) = cost
    assert calls == more_calls
    assert abs(more_read - read) < 40, (read, more_read)
