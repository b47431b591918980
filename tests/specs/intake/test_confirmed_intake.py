"""Behind a primary with replicas, what a worker writes before a step it cannot take back is on a replica
first: a prompt is generated only once a replica has its delivery's note, and an intake that met a
failover is made again on the new primary, where the notes decide who generates
(`workers/intake/confirmed_intake.py`); a dead letter is on a replica before its message is acknowledged."""
from __future__ import annotations

import signal
import threading

import pytest
import redis

from contract.redis_link import replication
from contract.ledger.codec import pack_ids
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.keys import REPLICATED
from contract.ledger.ledger import Ledger
from contract.redis_link.replication import primary
from producer.local import start_redis, wait_for
from workers.intake import deliveries
from workers.intake.confirmed_intake import after_failover, again, take
from workers.intake.deliveries import Started
from workers.intake.burial import put_letter


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """What this process saw of primaries and their replicas starts empty, as in a new worker."""
    for name in ("_had", "_short_since", "_attached_to", "_looked"):
        monkeypatch.setattr(replication, name, {})
    monkeypatch.setattr(replication, "_last_replicas", [0])


def _queued(client: redis.Redis, *prompt_ids: str) -> None:
    Ledger(client, "r").enqueue({pid: pack_ids([1, 2, 3]) for pid in prompt_ids})


def test_a_primary_without_replicas_takes_a_prompt_in_one_script_call_with_no_barrier(client):
    # Given a plain Redis without replicas, and a queued prompt
    _queued(client, "a")
    # When a worker takes it in
    intake = take(client, "r", "a", "w1", most=5)
    # Then its delivery is noted, and no barrier was sent (nothing more than the intake itself)
    assert (intake.ids, intake.held_by, intake.noted) == (pack_ids([1, 2, 3]), [], True)
    assert deliveries.holders(client, "r", "a") == ["w1"] and client.get(REPLICATED) is None


@pytest.fixture
def with_replica(tmp_path):
    """A primary (its client) and its one replica (a client and its process, to freeze)."""
    first, url = start_redis(tmp_path / "primary")
    second, replica_url = start_redis(tmp_path / "replica")
    primary_client, replica = redis.Redis.from_url(url), redis.Redis.from_url(replica_url)
    try:
        primary_client.config_set("repl-diskless-sync-delay", 0)
        replica.replicaof("127.0.0.1", primary_client.connection_pool.connection_kwargs["port"])
        wait_for(lambda: primary(primary_client).replicas == 1 and
                 replica.info("replication")["master_link_status"] == "up", 20, "the replica")
        yield primary_client, replica, second
    finally:
        second.signal(signal.SIGCONT)
        second.stop()
        first.stop()


def _while_frozen(process, write) -> list:
    """Run `write` while the replica is frozen: whether it returned then, and what it returned
    once the replica went on (empty if it had returned already)."""
    process.signal(signal.SIGSTOP)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(write()))
    thread.start()
    thread.join(0.5)
    early = list(done)
    process.signal(signal.SIGCONT)
    thread.join(30)
    return [] if early else done


def test_behind_a_primary_with_a_replica_the_intake_returns_only_once_the_replica_has_the_note(with_replica):
    # Given a primary with one replica, and a queued prompt the process has taken in once
    primary_client, replica, process = with_replica
    _queued(primary_client, "a")
    take(primary_client, "r", "a", "w0", most=5)

    # When a worker takes the prompt in while the replica is frozen
    taken = _while_frozen(process, lambda: take(primary_client, "r", "a", "w1", most=5))

    # Then the intake returned only once the replica went on (until then its note could be lost
    # with the primary), and the replica has its note
    assert taken and taken[0].noted and taken[0].held_by == ["w0"]
    assert deliveries.holders(replica, "r", "a") == ["w0", "w1"]


def test_behind_a_primary_with_a_replica_a_dead_letter_is_stored_only_once_the_replica_has_it(with_replica):
    # Given a primary with one replica, and a queued prompt
    primary_client, replica, process = with_replica
    _queued(primary_client, "a")
    letter = DeadLetter(id="a", run="r", reason="truncated", message="m", attempts=1, servers=[], worker="w1",
                        prompt_b64="", prompt_tokens=3, sampling={})

    # When its dead letter is stored while the replica is frozen
    found = _while_frozen(process, lambda: put_letter(primary_client, letter))

    # Then it returned (and its message may be acknowledged) only once the replica had the letter
    assert found == ["queued"]
    assert Ledger(replica, "r").state("a") == "dead" and DeadLetters(replica, "r").get("a").reason == "truncated"


def test_an_intake_made_again_after_a_failover_counts_one_delivery_and_yields_to_whoever_came_first(client):
    # Given prompts whose notes on the new primary hold, in order: only w2 (w1's first note was
    # lost with the old primary); w2 then w1 (w1's first note reached the replica after w2's);
    # w1 then w2 (w2 noted after w1's first note, found w1 holding it, and stands aside)
    _queued(client, "lost", "after", "before")
    for pid, names in {"lost": ["w2"], "after": ["w2", "w1"], "before": ["w1", "w2"]}.items():
        for name in names:
            deliveries.note(client, "r", pid, name)

    # When w1 takes each in again on the new primary
    lost, after, before = (again(client, "r", pid, "w1", most=5) for pid in ("lost", "after", "before"))

    # Then w2 decides where w2 came first, and nobody before w1 where w1 did
    assert (lost.held_by, after.held_by, before.held_by) == (["w2"], ["w2"], [])
    # ...and each delivery of w1 is noted once
    assert lost.noted and after.noted and before.noted
    assert [deliveries.holders(client, "r", pid) for pid in ("lost", "after", "before")] == \
        [["w2", "w1"], ["w2", "w1"], ["w1", "w2"]]


def test_the_names_that_decide_are_those_before_this_deliverys_first_note():
    assert after_failover([], "w1") == ([], False)
    assert after_failover(["w2", "w3"], "w1") == (["w2", "w3"], False)
    assert after_failover(["w2", "w1"], "w1") == (["w2"], True)
    assert after_failover(["w1", "w2"], "w1") == ([], True)
    assert after_failover(["w1", "w2", "w1", "w3"], "w1") == (["w1", "w2"], True)


def test_a_failover_reasserts_the_notes_of_finished_intakes_only():
    # Given a prompt whose intake is over and one whose intake is in progress
    started = Started()
    started.counted("r", "p1")
    with started.taking("r", "p2"):
        # Then both are listed as held, but only the first is noted again on a new primary (the
        # second's intake notes its own: a note written for it would put it before another worker)
        assert started.holding() == {"r": ["p1", "p2"]}
        assert started.noted() == {"r": ["p1"]}
