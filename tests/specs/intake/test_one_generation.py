"""One generation at a time, on one clock: what a worker lists as held, when a second message is a duplicate,
and Redis's clock as every process reads it."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

from contract.fleet import heartbeats
from contract.redis_link.clock import RedisClock
from contract.ledger.codec import pack_ids
from contract.ledger.ledger import Ledger
from workers.intake.deliveries import Started, elsewhere, settled_meanwhile
from workers.settings import Settings


def _beat(client, worker: str, holding: dict[str, list[str]], ttl: float = 30) -> None:
    heartbeats.publish(client, worker, [], ttl=ttl, holding=lambda: holding)


@contextmanager
def _beating(client, worker: str, holding: dict[str, list[str]], every: float = 0.3) -> Iterator[None]:
    """A live worker's heartbeats, one every `every` seconds from `every` on (how many it takes to be
    dated after a waiting delivery began depends on how well this process reads Redis's clock: on a
    loaded machine, one 0.3 s on may not be)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            _beat(client, worker, holding)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def test_a_prompt_is_listed_as_held_from_before_its_intake_until_it_is_settled_or_let_go():
    started = Started()
    with started.taking("r", "p1"):
        assert started.holding() == {"r": ["p1"]}  # its note may be written now
        started.counted("r", "p1")
    assert started.holds("r", "p1") and started.holding() == {"r": ["p1"]}
    started.let_go("r", "p1")  # its lease is left to run out: another worker may start it
    assert not started.holds("r", "p1") and started.holding() == {}
    started._settle("r", "p1")
    with started.taking("r", "p1"):  # taken again later: held again
        assert started.holds("r", "p1")
    assert started.holding() == {}


def test_a_second_message_is_a_duplicate_only_while_a_live_worker_lists_its_prompt(client):
    # Given w2, live and generating p1, whose heartbeat lists it; w3, whose name is in p1's note but
    # whose heartbeat expired
    _beat(client, "w2", {"r": ["p1"]})
    # When w2 writes its next heartbeats while w1 waits
    # Then a delivery whose note names w2 before it is a duplicate; one naming only a dead
    # worker or this worker's predecessor is not
    with _beating(client, "w2", {"r": ["p1"]}):
        assert elsewhere(client, "r", "p1", "w1", ["w2"], patience=10) == "w2"
    assert elsewhere(client, "r", "p1", "w1", ["w3", "w1"], patience=0) is None
    assert elsewhere(client, "r", "p2", "w1", [], patience=0) is None


def test_the_last_heartbeat_of_a_killed_worker_is_no_proof_it_generates_the_prompt(client):
    # Given w2's last heartbeat, listing p1, written before w2 was SIGKILLed, living 2 s (past w2's
    # lease, which handed p1's only message back)
    _beat(client, "w2", {"r": ["p1"]}, ttl=2)
    started = time.monotonic()
    # When w1 takes that message: Then it goes ahead with p1 once the heartbeat has expired (none
    # newer came), instead of dropping the message as a duplicate
    assert elsewhere(client, "r", "p1", "w1", ["w2"], patience=30) is None
    assert 1.0 <= time.monotonic() - started < 10


def test_a_live_worker_that_does_not_list_the_prompt_is_asked_again_by_its_next_heartbeat(client):
    # Given w2's heartbeat, written before w2's intake of p1 noted it
    _beat(client, "w2", {"r": []})
    # When w2's next heartbeats come while w1 waits, listing p1
    with _beating(client, "w2", {"r": ["p1"]}):
        # Then w1 finds p1 generating on w2
        assert elsewhere(client, "r", "p1", "w1", ["w2"], patience=10) == "w2"
        # and a prompt its next heartbeats do not list either goes ahead
        assert elsewhere(client, "r", "p2", "w1", ["w2"], patience=10) is None


def test_a_heartbeat_late_by_more_than_three_rounds_is_waited_for_while_the_last_one_lives(client):
    # Given w2's heartbeat, written before w2's intake of p1, living a heartbeat's time to live
    settings = Settings(sglang_urls="http://a", health_interval=1)
    _beat(client, "w2", {"r": []}, ttl=settings.heartbeat_ttl)
    # When w2's next heartbeat, listing p1, comes 3.5 s later (its health thread waited out a
    # failover's retries), past three health rounds
    threading.Timer(3.5, lambda: _beat(client, "w2", {"r": ["p1"]}, ttl=settings.heartbeat_ttl)).start()
    # Then w1, waiting as its task does (a heartbeat's time to live), finds p1 generating on w2
    assert elsewhere(client, "r", "p1", "w1", ["w2"], patience=settings.heartbeat_ttl) == "w2"


def test_a_worker_that_writes_no_heartbeat_before_its_last_expires_is_not_generating(client):
    # Given w2's heartbeat, not listing p1, that lives 2 s
    _beat(client, "w2", {"r": []}, ttl=2)
    # When w2 writes no other
    started = time.monotonic()
    # Then w1 goes ahead with p1 once that heartbeat has expired, without waiting out its patience
    assert elsewhere(client, "r", "p1", "w1", ["w2"], patience=30) is None
    assert 1.0 <= time.monotonic() - started < 10


def test_heartbeats_are_timed_and_aged_on_redis_clock(client):
    clock = RedisClock()
    seconds, micros = client.time()
    assert abs(clock.now(client) - (seconds + micros / 1e6)) < 1.0
    _beat(client, "w2", {"r": ["p1"]})
    (record,) = heartbeats.read_all(client)
    assert abs(record["at"] - clock.now()) < 1.0
    assert heartbeats.held(client) == {"r": {"p1"}}


def test_a_prompt_another_worker_stored_while_this_delivery_waited_is_not_generated_again(client):
    # Given p1 and p2 queued in run r2; p1 then stored by w2 (its heartbeat, awaited by w1's second
    # message, no longer lists it), p2 still queued
    ledger = Ledger(client, "r2")
    ledger.enqueue({"p1": pack_ids([1, 2, 3]), "p2": pack_ids([4, 5])})
    ledger.mark_done("p1", 3, "part-w2.parquet")

    # When w1's delivery, whose note named w2 before it, looks again after its wait
    # Then p1 is settled (done), so w1 acknowledges it; p2 is not, and neither is a prompt whose note
    # named only w1's predecessor (no one else can have stored it: the ledger is not read)
    assert settled_meanwhile(client, "r2", "p1", "w1", ["w2"]) == "done"
    assert settled_meanwhile(client, "r2", "p2", "w1", ["w2"]) is None
    assert settled_meanwhile(client, "r2", "p1", "w1", ["w1"]) is None
