"""The ledger's transitions, against a real redis-server (started once for this module,
in a fraction of a second; no worker, no stand-in).

Given prompts in every state, when any transition is asked for in any order
(including the ones a redelivery, a race or an operator can cause), then the
state changes only along the ledger's table, a done prompt never gets a dead
letter, a letter exists exactly while its prompt is dead, and the counts the
transitions keep equal a full count of the ledger: queued + done + dead ==
enqueued.
"""
from __future__ import annotations

import json
import random

import pytest
import redis

from contract.codec import pack_ids
from contract.deadletters import DeadLetter, DeadLetters
from contract.ledger import Ledger
from producer.local import start_redis


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    process.stop()


@pytest.fixture
def client(server):
    client = redis.Redis.from_url(server)
    client.flushdb()
    return client


def letter(pid: str, reason: str = "missing_think_end") -> DeadLetter:
    return DeadLetter(id=pid, run="r", reason=reason, message="m", attempts=1, servers=[], worker="w",
                      prompt_b64="", prompt_tokens=3, sampling={})


def enqueue(ledger: Ledger, *pids: str) -> int:
    return ledger.enqueue({pid: pack_ids([1, 2, 3]) for pid in pids})


def check_invariants(ledger: Ledger, store: DeadLetters) -> None:
    tally, counted = ledger.tally(), ledger.counts()
    assert (tally.queued, tally.done, tally.dead) == tuple(counted.get(s, 0) for s in ("queued", "done", "dead"))
    assert tally.queued + tally.done + tally.dead == tally.enqueued
    assert tally.reasons == store.scan_stats() == store.stats()
    letters = {d.id for d in store}
    dead = {pid for pid, s in ledger.client.hgetall(ledger.keys.state).items() if s == b"dead"}
    assert letters <= {p.decode() for p in dead}
    assert ledger.pending_ids() == {p.decode() for p, s in ledger.client.hgetall(ledger.keys.state).items()
                                    if s == b"queued"}


def test_enqueue_counts_only_prompts_the_run_does_not_have(client):
    ledger = Ledger(client, "r")
    assert enqueue(ledger, "a", "b") == 2
    assert enqueue(ledger, "b", "c") == 1
    tally = ledger.tally()
    assert (tally.enqueued, tally.queued, tally.prompt_tokens, tally.exact) == (3, 3, 9, True)


def test_a_done_prompt_is_never_dead_lettered_and_a_second_success_changes_nothing(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a")
    assert ledger.mark_done("a", 10) == "queued"
    assert store.put(letter("a")) == "done"
    assert ledger.mark_done("a", 10) == "done"
    assert ledger.state("a") == "done" and store.get("a") is None and ledger.payload("a") is None
    tally = ledger.tally()
    assert (tally.done, tally.dead, tally.output_tokens, tally.reasons) == (1, 0, 10, {})
    check_invariants(ledger, store)


def test_a_dead_prompt_that_succeeds_on_a_redelivery_becomes_done_and_loses_its_letter(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a")
    assert store.put(letter("a", "truncated")) == "queued"
    assert store.stats() == {"truncated": 1} and ledger.payload("a") is None
    assert ledger.mark_done("a", 5) == "dead"
    assert store.get("a") is None and store.stats() == {} and ledger.tally().done == 1
    check_invariants(ledger, store)


def test_a_redelivered_failure_replaces_the_letter_and_its_reason_count(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a")
    store.put(letter("a", "truncated"))
    assert store.put(letter("a", "aborted")) == "dead"
    assert store.get("a").reason == "aborted" and store.stats() == {"aborted": 1} and ledger.tally().dead == 1


def test_requeue_moves_only_dead_prompts_back_to_queued(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "dead", "done")
    store.put(letter("dead"))
    ledger.mark_done("done", 1)
    assert ledger.requeue({"dead": pack_ids([7]), "done": pack_ids([7])}) == 1
    assert ledger.states(["dead", "done"]) == ["queued", "done"]
    assert ledger.payload("dead") == pack_ids([7]) and ledger.payload("done") is None
    assert store.get("dead") is None and ledger.tally().enqueued == 2
    check_invariants(ledger, store)


def test_purged_letters_leave_their_prompts_dead(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a", "b")
    store.put(letter("a")), store.put(letter("b", "aborted"))
    assert store.remove(["a", "zzz"]) == 1
    assert ledger.states(["a", "b"]) == ["dead", "dead"] and ledger.tally().dead == 2
    assert store.stats() == {"aborted": 1}
    check_invariants(ledger, store)


def test_transitions_on_a_pipeline_are_the_same_scripts(client):
    # enqueue and `dead requeue` record prompts on a pipeline, then publish
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    with client.pipeline(transaction=False) as pipe:
        ledger.mark_queued(pipe, {"a": pack_ids([1]), "b": pack_ids([1, 2])}, 0)
        pipe.execute()
    store.put(letter("a"))
    with client.pipeline(transaction=False) as pipe:
        ledger.mark_queued(pipe, {"a": pack_ids([1]), "b": pack_ids([1])}, 0, count_as_new=False)
        pipe.execute()
    assert ledger.states(["a", "b"]) == ["queued", "queued"] and ledger.tally().prompt_tokens == 3
    check_invariants(ledger, store)


def test_a_run_without_state_counts_is_counted_by_a_scan(client):
    # Given a run a version without state counts enqueued (its counters have no `tallied`)
    client.hset("fleet:run:old:counters", mapping={"enqueued": 2, "done": 5})
    client.hset("fleet:run:old:state", mapping={"a": "dead", "b": "done"})
    client.hset("fleet:run:old:dead", "a", json.dumps(letter("a", "aborted").__dict__))
    store = DeadLetters(client, "old")
    assert not store.ledger.tally().exact and store.stats() == {"aborted": 1}


def test_any_order_of_transitions_keeps_the_counts_true(client):
    # Given ten prompts, when a random mix of every transition hits them (as redeliveries,
    # races and operators would), then the invariants hold after every step
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    rng = random.Random(7)
    pids = [f"p{i}" for i in range(10)]
    for _ in range(300):
        pid, op = rng.choice(pids), rng.randrange(5)
        if op == 0:
            enqueue(ledger, pid)
        elif op == 1:
            before = ledger.state(pid)
            ledger.mark_done(pid, 3)
            assert ledger.state(pid) == ("done" if before else None)
        elif op == 2:
            before = ledger.state(pid)
            store.put(letter(pid, rng.choice(["aborted", "truncated"])))
            assert ledger.state(pid) == {"queued": "dead"}.get(before, before)
        elif op == 3:
            ledger.requeue({pid: pack_ids([1, 2, 3])})
        else:
            store.remove([pid])
        check_invariants(ledger, store)
