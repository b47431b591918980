"""`replicated`: writes are reported only once a replica has them (a primary and a replica, real)."""
from __future__ import annotations

import threading
import time

import pytest
import redis

from contract.keys import REPLICATED
from contract.redis_link import replication
from contract.redis_link.replication import confirm, confirmed, had, primary, replicated
from producer.local import start_redis, wait_for


def test_a_primary_without_replicas_writes_no_barrier_and_waits_for_nothing(client):
    with replicated(client):
        client.set("k", "v")
    assert client.get(REPLICATED) is None and client.get("k") == b"v"


def test_a_plain_redis_is_asked_one_info_a_look_and_never_its_attach_counters(client, monkeypatch):
    # Given a process that never saw a primary with replicas
    for name in ("_had", "_short_since", "_attached_to", "_looked"):
        monkeypatch.setattr(replication, name, {}, raising=False)
    monkeypatch.setattr(replication, "_last_replicas", [0])
    client.config_resetstat()

    # When it confirms writes three times and looks at the primary once
    for n in range(3):
        confirmed(client, lambda pipe: pipe.set("k", n))
    primary(client)

    # Then each was one INFO (its replication section), as before the attach counters were read
    assert client.info("commandstats")["cmdstat_info"]["calls"] == 4


def test_writes_on_any_connection_are_on_the_replica_when_the_call_returns(server, tmp_path):
    # Given a primary with one replica
    process, url = start_redis(tmp_path)
    try:
        primary_client = redis.Redis.from_url(url)
        primary_client.config_set("repl-diskless-sync-delay", 0)  # sync at once, not after 5 s
        replica = redis.Redis.from_url(server)
        replica.replicaof("127.0.0.1", primary_client.connection_pool.connection_kwargs["port"])
        wait_for(lambda: primary(primary_client).replicas == 1 and
                 replica.info("replication")["master_link_status"] == "up", 20, "the replica")
        other = redis.Redis.from_url(url)  # another client, another connection (kombu's, say)

        # When writes on two connections are confirmed
        for n in range(50):
            with replicated(primary_client):
                primary_client.set(f"ledger:{n}", n)
                other.lpush("queue", n)

            # Then the replica has both the moment the call returns
            assert replica.get(f"ledger:{n}") == str(n).encode()
            assert replica.llen("queue") == n + 1
    finally:
        redis.Redis.from_url(server).replicaof("NO", "ONE")
        process.stop()


def test_writes_and_their_barrier_go_in_one_round_trip_and_return_their_replies(client):
    replies = confirmed(client, lambda pipe: (pipe.set("a", 1), pipe.incr("n")))
    assert replies == [True, 1] and client.get("a") == b"1"


def test_a_primary_that_lost_the_replica_it_had_is_no_confirmation_until_it_is_trusted_alone(server, tmp_path):
    # Given a primary whose writes a replica confirmed
    process, url = start_redis(tmp_path)
    replica = redis.Redis.from_url(server)
    try:
        primary_client = redis.Redis.from_url(url)
        primary_client.config_set("repl-diskless-sync-delay", 0)
        replica.replicaof("127.0.0.1", primary_client.connection_pool.connection_kwargs["port"])
        wait_for(lambda: primary(primary_client).replicas == 1 and
                 replica.info("replication")["master_link_status"] == "up", 20, "the replica")
        confirmed(primary_client, lambda pipe: pipe.set("first", 1))
        assert replica.get("first") == b"1"

        # When the replica is promoted (a switchover) while the client still writes to the old primary
        replica.replicaof("NO", "ONE")
        wait_for(lambda: primary(primary_client).replicas == 0, 20, "the old primary without its replica")
        before = primary(primary_client)
        assert had(before) == 1  # it had one: a barrier that reaches none is no confirmation

        # Then a write there is not reported while the primary may be being replaced: only after
        # the alone-after, with no Sentinel naming another primary, does it go on alone
        started = time.monotonic()
        primary_client.set("late", 1)
        confirm(primary_client, before, wait_ms=50, alone_after=0.5)
        assert time.monotonic() - started >= 0.5
        assert had(primary(primary_client)) == 0  # and the next writes no longer wait for it
    finally:
        replica.replicaof("NO", "ONE")
        process.stop()


@pytest.fixture
def two_replicas(server, tmp_path):
    """A primary (its client) with two replicas, both in sync: the module's server, and another."""
    process, url = start_redis(tmp_path / "primary")
    second, second_url = start_redis(tmp_path / "second")
    replicas = redis.Redis.from_url(server), redis.Redis.from_url(second_url)
    try:
        primary_client = redis.Redis.from_url(url)
        primary_client.config_set("repl-diskless-sync-delay", 0)
        port = primary_client.connection_pool.connection_kwargs["port"]
        for replica in replicas:
            replica.replicaof("127.0.0.1", port)
        wait_for(lambda: primary(primary_client).replicas == 2 and all(
            r.info("replication")["master_link_status"] == "up" for r in replicas), 20, "two replicas")
        confirmed(primary_client, lambda pipe: pipe.set("first", 1))
        assert had(primary(primary_client)) == 2
        yield primary_client, replicas
    finally:
        replicas[0].replicaof("NO", "ONE")
        second.stop()
        process.stop()


def _one_replica_left(primary_client, replicas) -> None:
    """The first replica leaves (promoted: a switchover the Sentinels do not name yet, or lost)."""
    replicas[0].replicaof("NO", "ONE")
    wait_for(lambda: primary(primary_client).replicas == 1, 20, "the primary with one replica left")


def test_a_primary_with_two_replicas_whose_first_is_promoted_is_no_confirmation_by_the_other_at_once(two_replicas):
    # Given a primary whose two replicas confirm its writes
    primary_client, replicas = two_replicas

    # When one replica is promoted (a switchover the Sentinels do not name yet) while the
    # other, still attached, acknowledges what the old primary takes
    _one_replica_left(primary_client, replicas)
    started = time.monotonic()
    confirmed(primary_client, lambda pipe: pipe.set("late", 1), wait_ms=50, alone_after=0.5)

    # Then the write is not reported at once on the word of the replica left (its resync from
    # the promoted one would drop it): only after the alone-after does the primary go on with it
    assert time.monotonic() - started >= 0.5
    assert had(primary(primary_client)) == 1


def test_writes_waiting_together_for_a_replica_lost_for_good_all_go_on_after_the_alone_after(two_replicas):
    # Given a primary whose two replicas confirm its writes, and writes begun while it had both
    primary_client, replicas = two_replicas
    before = primary(primary_client)

    # When one replica is gone for good while three writes wait for their confirmation
    _one_replica_left(primary_client, replicas)
    done: list[float] = []
    started = time.monotonic()

    def write(n: int) -> None:
        primary_client.set(f"w{n}", n)
        confirm(primary_client, before, wait_ms=50, alone_after=0.5)
        done.append(time.monotonic() - started)

    threads = [threading.Thread(target=write, args=(n,), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    # Then every one goes on once the replica is taken as lost (the first to find it lowers the
    # count for the others), none waits for it for ever
    assert len(done) == 3 and max(done) < 5, done


def test_a_replica_that_joined_unseen_is_no_confirmation_once_the_replica_seen_is_promoted(server, tmp_path):
    """The window of a second switchover struck just after the first healed: the primary had one
    replica this process saw, a second joined (the old primary, resynced) and the first was
    promoted before this process wrote there again. The count it saw (one) is met by the
    replica left, which the Sentinels then point at the promoted one: its full resync drops
    what it acknowledged. So the replicas a primary had are every one this process saw attached
    to it, not the most it saw at once."""
    process, url = start_redis(tmp_path / "primary")
    second, second_url = start_redis(tmp_path / "second")
    seen, joined = redis.Redis.from_url(server), redis.Redis.from_url(second_url)
    try:
        # Given a primary whose one replica confirmed this process's writes
        primary_client = redis.Redis.from_url(url)
        primary_client.config_set("repl-diskless-sync-delay", 0)
        port = primary_client.connection_pool.connection_kwargs["port"]
        seen.replicaof("127.0.0.1", port)
        wait_for(lambda: primary(primary_client).replicas == 1 and
                 seen.info("replication")["master_link_status"] == "up", 20, "the first replica")
        confirmed(primary_client, lambda pipe: pipe.set("first", 1))
        assert had(primary(primary_client)) == 1

        # When a second replica joins, unseen by this process (no write of its meanwhile), and
        # the first is promoted before it writes there again
        joined.replicaof("127.0.0.1", port)
        wait_for(lambda: joined.info("replication")["master_link_status"] == "up", 20, "the second replica")
        seen.replicaof("NO", "ONE")
        wait_for(lambda: primary_client.info("replication")["connected_slaves"] == 1 and
                 primary_client.info("replication")["slave0"]["port"] != seen.connection_pool.connection_kwargs["port"],
                 20, "the old primary with the second replica only")
        started = time.monotonic()
        confirmed(primary_client, lambda pipe: pipe.set("late", 1), wait_ms=50, alone_after=0.5)

        # Then the second replica's acknowledgement is no confirmation at once: the primary lost a
        # replica it had, and only the alone-after (no Sentinel naming another) lets it go on
        assert time.monotonic() - started >= 0.5
        assert had(primary(primary_client)) == 1
    finally:
        seen.replicaof("NO", "ONE")
        second.stop()
        process.stop()


def _port(client: redis.Redis) -> int:
    return client.connection_pool.connection_kwargs["port"]


def _following(replica: redis.Redis, of: redis.Redis) -> bool:
    info = replica.info("replication")
    return info["role"] == "slave" and int(info["master_port"]) == _port(of) and info["master_link_status"] == "up"


@pytest.fixture
def switched_once(tmp_path):
    """Two servers after a first switchover, as a worker saw them: it confirmed writes on the old
    primary behind its replica, then that replica was promoted and it wrote on the new primary
    while no replica was attached to it yet (had 0). Yields (old, new)."""
    old_process, old_url = start_redis(tmp_path / "old")
    new_process, new_url = start_redis(tmp_path / "new")
    old, new = redis.Redis.from_url(old_url), redis.Redis.from_url(new_url)
    try:
        for server in (old, new):
            server.config_set("repl-diskless-sync-delay", 0)
        new.replicaof("127.0.0.1", _port(old))
        wait_for(lambda: primary(old).replicas == 1 and _following(new, old), 20, "the replica")
        confirmed(old, lambda pipe: pipe.set("first", 1))
        new.replicaof("NO", "ONE")
        confirmed(new, lambda pipe: pipe.set("second", 1))
        assert had(primary(new)) == 0
        yield old, new
    finally:
        for server in (old, new):
            server.replicaof("NO", "ONE")
        old_process.stop()
        new_process.stop()


def test_a_replica_that_attached_unseen_and_was_promoted_is_no_confirmation_on_a_primary_that_never_showed_one(
        switched_once):
    """The window of a second switchover that promotes a replica attached less than a second before:
    this process never saw it attached, so the primary it leaves looks like one that never had a
    replica, which the Sentinels still name for a second or two. The primary's attach counters
    (`INFO stats`) rose since this process last looked: a replica came and went unseen."""
    old, new = switched_once

    # When the old primary attaches to the new one (unseen: no write of this process meanwhile)
    # and is promoted in its turn before this process writes there again
    old.replicaof("127.0.0.1", _port(new))
    wait_for(lambda: _following(old, new), 20, "the old primary a replica of the new one")
    old.replicaof("NO", "ONE")
    wait_for(lambda: new.info("replication")["connected_slaves"] == 0, 20, "the primary without its replica")
    started = time.monotonic()
    confirmed(new, lambda pipe: pipe.set("late", 1), wait_ms=50, alone_after=0.5)

    # Then the write is not reported at once: the primary had a replica, and only the alone-after
    # (no Sentinel naming another primary) lets it go on without one
    assert time.monotonic() - started >= 0.5


def test_a_replica_that_attached_unseen_and_stays_confirms_at_once(switched_once):
    # Given a worker's look at a primary without replicas
    old, new = switched_once

    # When a replica attaches unseen and stays attached
    old.replicaof("127.0.0.1", _port(new))
    wait_for(lambda: _following(old, new), 20, "the old primary a replica of the new one")
    started = time.monotonic()
    confirmed(new, lambda pipe: pipe.set("late", 1), wait_ms=1000, alone_after=5)

    # Then it is no replica gone: it confirms the write at once, as any replica attached
    assert time.monotonic() - started < 2 and old.get("late") == b"1"
    assert had(primary(new)) == 1


def test_a_replica_that_attached_unseen_beside_one_seen_and_was_promoted_is_no_confirmation_by_the_one_left(
        two_replicas, tmp_path):
    """Window 1 the other way round: the replica that stays attached is the one this process saw,
    and the one promoted joined unseen (the old primary, back as a replica). The one left
    acknowledges what the old primary takes until the Sentinels point it at the promoted one."""
    primary_client, replicas = two_replicas
    # Given a primary with one replica left (the second), seen by this process
    _one_replica_left(primary_client, replicas)
    confirmed(primary_client, lambda pipe: pipe.set("seen", 1), wait_ms=50, alone_after=0.1)
    assert had(primary(primary_client)) == 1

    # When the first attaches again, unseen, and is promoted before this process writes there again
    replicas[0].replicaof("127.0.0.1", _port(primary_client))
    wait_for(lambda: _following(replicas[0], primary_client), 20, "the first replica attached again")
    replicas[0].replicaof("NO", "ONE")
    wait_for(lambda: primary_client.info("replication")["connected_slaves"] == 1, 20, "the one seen left")
    started = time.monotonic()
    confirmed(primary_client, lambda pipe: pipe.set("late", 1), wait_ms=50, alone_after=0.5)

    # Then the acknowledgement of the one left is no confirmation at once
    assert time.monotonic() - started >= 0.5


def test_a_write_refused_by_a_primary_demoted_under_it_is_written_again_and_other_errors_are_not():
    # Given writes that meet, first, redis-py's word for a primary demoted under them (a Sentinel
    # connection's READONLY: nothing was written there), and, second, a plain connection failure
    tries = []

    def demoted_once() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise redis.ConnectionError(replication.DEMOTED)
        return "written"

    def unreachable() -> str:
        tries.append(2)
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    # Then the first is written again and reported; the second is raised at once, for its caller
    assert replication.written_again(demoted_once, "a letter") == "written" and tries == [1, 1]
    with pytest.raises(redis.ConnectionError):
        replication.written_again(unreachable, "a letter")
    assert tries == [1, 1, 2]
