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
from dataclasses import replace
import random


from contract.ledger.codec import pack_ids
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.keys import RunKeys
from contract.ledger.ledger import AGAIN, NEW, READ_CHUNK, Entry, Ledger, shard_code
from workers.intake import deliveries


def letter(pid: str, reason: str = "missing_think_end") -> DeadLetter:
    return DeadLetter(id=pid, run="r", reason=reason, message="m", attempts=1, servers=[], worker="w",
                      prompt_b64="", prompt_tokens=3, sampling={})


def enqueue(ledger: Ledger, *pids: str) -> int:
    """How many of `pids` were new to the run."""
    return ledger.enqueue({pid: pack_ids([1, 2, 3]) for pid in pids}).count(NEW)


def check_invariants(ledger: Ledger, store: DeadLetters, pids: list[str]) -> None:
    tally, counted = ledger.tally(), ledger.counts()
    assert (tally.queued, tally.done, tally.dead) == tuple(counted.get(s, 0) for s in ("queued", "done", "dead"))
    assert tally.queued + tally.done + tally.dead == tally.enqueued
    assert tally.reasons == store.scan_stats() == store.stats()
    states = dict(zip(pids, ledger.states(pids)))
    letters = {d.id for d in store}
    assert letters <= {pid for pid, s in states.items() if s == "dead"}
    queued = {pid for pid, s in states.items() if s == "queued"}
    assert pending_pass(ledger, count=3) == queued
    assert ledger.pending(pids) == [pid in queued for pid in pids]


def pending_pass(ledger, count: int) -> set[str]:
    """Every prompt one full pass of `pending_page` names, a page of `count` at a time."""
    cursor, seen = None, set()
    while cursor != 0:
        cursor, page = ledger.pending_page(cursor or 0, count)
        seen.update(page)
    return seen


def test_enqueue_counts_only_prompts_the_run_does_not_have(client):
    ledger = Ledger(client, "r")
    assert enqueue(ledger, "a", "b") == 2
    assert enqueue(ledger, "b", "c") == 1
    tally = ledger.tally()
    assert (tally.enqueued, tally.queued, tally.prompt_tokens) == (3, 3, 9)


def test_a_done_prompt_is_never_dead_lettered_and_a_second_success_changes_nothing(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a")
    assert ledger.mark_done("a", 10, "part-1.parquet") == "queued"
    assert store.put(letter("a")) == "done"
    assert ledger.mark_done("a", 10, "part-2.parquet") == "done"
    assert ledger.state("a") == "done" and store.get("a") is None and ledger.intake("a")[0] is None
    tally = ledger.tally()
    assert (tally.done, tally.dead, tally.output_tokens, tally.reasons) == (1, 0, 10, {})
    check_invariants(ledger, store, ["a"])


def test_a_dead_prompt_that_succeeds_on_a_redelivery_becomes_done_and_loses_its_letter(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a")
    assert store.put(letter("a", "truncated")) == "queued"
    assert store.stats() == {"truncated": 1} and ledger.intake("a")[0] is None
    assert ledger.mark_done("a", 5, "part-1.parquet") == "dead"
    assert store.get("a") is None and store.stats() == {} and ledger.tally().done == 1
    check_invariants(ledger, store, ["a"])


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
    ledger.mark_done("done", 1, "part-1.parquet")
    assert ledger.requeue({"dead": pack_ids([7]), "done": pack_ids([7])}) == ["dead"]
    assert ledger.states(["dead", "done"]) == ["queued", "done"]
    assert ledger.intake("dead")[0] == pack_ids([7]) and ledger.intake("done")[0] is None
    assert store.get("dead") is None and ledger.tally().enqueued == 2
    # a second requeue of the same letter (a scan that met it twice) moves nothing
    assert ledger.requeue({"dead": pack_ids([7])}) == []
    check_invariants(ledger, store, ["dead", "done"])


def test_a_requeues_budget_is_read_by_every_intake_while_queued_and_goes_when_it_settles(client):
    # Given three dead prompts, requeued with the budgets their messages carry (one with none)
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a", "b", "c")
    for pid in "abc":
        store.put(letter(pid))
    ledger.requeue({pid: pack_ids([7]) for pid in "abc"}, budgets={"a": 1024, "b": 512, "c": None})
    # Then while queued each one's intake (any delivery's, whatever message brought it) reads its budget
    assert [ledger.intake(pid, "w1", 3).budget for pid in "abc"] == [1024, 512, None]
    # and once stored, or dead again, none is left behind
    ledger.mark_done("a", 3, "part-1.parquet")
    store.put(letter("b"))
    assert client.hlen(RunKeys("r").budgets) == 0
    # and a requeue with none leaves none, whatever an earlier one gave
    ledger.requeue({"b": pack_ids([7])}, budgets={"b": None})
    assert ledger.intake("b").budget is None
    check_invariants(ledger, store, ["a", "b", "c"])


def test_purged_letters_leave_their_prompts_dead(client):
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a", "b")
    store.put(letter("a")), store.put(letter("b", "aborted"))
    assert store.remove(["a", "zzz"]) == 1
    assert ledger.states(["a", "b"]) == ["dead", "dead"] and ledger.tally().dead == 2
    assert store.stats() == {"aborted": 1}
    check_invariants(ledger, store, ["a", "b"])


def test_transitions_on_a_pipeline_are_the_same_scripts(client):
    # the scale bench fills a ledger with pipelined transitions
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    with client.pipeline(transaction=False) as pipe:
        ledger.enqueue({"a": pack_ids([1]), "b": pack_ids([1, 2])}, 1, pipe)
        ledger.mark_done("b", 4, "part-1.parquet", pipe)
        (outcomes, found) = pipe.execute()
    assert (Ledger.outcomes([outcomes]), found) == ([NEW, NEW], [b"queued"])
    store.put(letter("a"))
    with client.pipeline(transaction=False) as pipe:
        ledger.requeue({"a": pack_ids([1]), "b": pack_ids([1])}, pipe)
        assert pipe.execute() == [[1, 0]]
    assert ledger.states(["a", "b"]) == ["queued", "done"] and ledger.tally().prompt_tokens == 3
    check_invariants(ledger, store, ["a", "b"])


def test_enqueue_tells_new_prompts_from_repeats_of_this_call_and_from_prompts_the_run_had(client):
    # Given a run that has a done, a dead and a queued prompt, enqueued by call 1
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue_call = lambda call, *pids: ledger.enqueue([(p, pack_ids([1, 2])) for p in pids], call)  # noqa: E731
    assert enqueue_call(1, "done", "dead", "queued") == [NEW, NEW, NEW]
    ledger.mark_done("done", 1, "part-1.parquet")
    store.put(letter("dead"))

    # When call 2 enqueues them with a new prompt repeated (a duplicate in its file), in
    # one script call and across two
    first = enqueue_call(2, "new", "done", "dead", "queued", "new")
    second = enqueue_call(2, "new")

    # Then the new prompt is queued once, its repeats are told apart from prompts the run
    # already had (queued by call 1 counts as had), and nothing the run had changes
    assert first == [NEW, "done", "dead", "queued", AGAIN] and second == [AGAIN]
    assert enqueue_call(3, "new") == ["queued"]
    tally = ledger.tally()
    assert (tally.enqueued, tally.queued, tally.done, tally.dead, tally.prompt_tokens) == (4, 2, 1, 1, 8)
    check_invariants(ledger, store, ["new", "done", "dead", "queued"])


def test_the_first_durable_copy_of_a_prompt_is_its_canonical_one(client):
    # Given a prompt stored in shard A, then stored again in shard B by a redelivery
    ledger = Ledger(client, "r")
    enqueue(ledger, "a")
    assert ledger.mark_done("a", 3, "/out/r/part-A.parquet") == "queued"
    assert ledger.mark_done("a", 3, "/out/r/part-B.parquet") == "done"

    # Then the ledger names shard A (by its file name, wherever the folder is), counted once
    assert ledger.entries(["a"]) == [Entry("done", shard=shard_code("part-A.parquet"))]
    assert shard_code("part-A.parquet") != shard_code("part-B.parquet")
    assert ledger.tally().done == 1 and ledger.tally().output_tokens == 3
    # and counts shard A as holding one canonical row, shard B none
    assert (ledger.canonical_rows("part-A.parquet"), ledger.canonical_rows("part-B.parquet")) == (1, 0)


def test_finished_prompts_are_kept_in_compact_buckets(client):
    # Given 5,000 finished prompts
    ledger = Ledger(client, "r")
    pids = [f"prompt-{i:06d}" for i in range(5000)]
    with client.pipeline(transaction=False) as pipe:
        ledger.enqueue({p: pack_ids([1]) for p in pids}, 1, pipe)
        for pid in pids:
            ledger.mark_done(pid, 1, f"part-{pid[-2:]}.parquet", pipe)
        pipe.execute()

    # Then no hash keyed by id is left, and every state bucket is a listpack
    keys = RunKeys("r")
    assert client.hlen(keys.token_ids) == 0
    buckets = list(client.scan_iter(match=keys.state_prefix + "*", count=1000))
    assert 4000 < len(buckets) <= 5000
    assert {client.object("encoding", b) for b in buckets[:500]} == {b"listpack"}
    assert ledger.counts() == {"done": 5000} and ledger.tally().done == 5000


def test_any_order_of_transitions_keeps_the_counts_true(client):
    # Given ten prompts, when a random mix of every transition hits them (as redeliveries,
    # races and operators would), then the invariants hold after every step
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    rng = random.Random(7)
    pids = [f"p{i}" for i in range(10)]
    for _ in range(300):
        pid, op = rng.choice(pids), rng.randrange(7)
        if op == 0:
            enqueue(ledger, pid)
        elif op == 1:
            before = ledger.state(pid)
            ledger.mark_done(pid, 3, f"part-{rng.randrange(3)}.parquet")
            assert ledger.state(pid) == ("done" if before else None)
        elif op == 2:
            before = ledger.state(pid)
            store.put(letter(pid, rng.choice(["aborted", "truncated"])))
            assert ledger.state(pid) == {"queued": "dead"}.get(before, before)
        elif op == 3:
            ledger.requeue({pid: pack_ids([1, 2, 3])})
        elif op == 4:
            store.remove([pid])
        elif op == 5:  # a group is about to be written; a delivery finds an entry only while pending
            ledger.writing(rng.sample(pids, 3), f"part-{rng.randrange(3)}.parquet")
            assert ledger.intake(pid)[1] is None or ledger.state(pid) in ("queued", "dead")
        else:  # a group is stored, and its entries go
            group = rng.sample(pids, 3)
            before = ledger.states(group)
            ledger.mark_group_done([(p, 3) for p in group], f"part-{rng.randrange(3)}.parquet")
            assert ledger.states(group) == [("done" if s else None) for s in before]
            assert client.hmget(RunKeys("r").writing, group) == [None] * 3
        check_invariants(ledger, store, pids)


def test_a_group_is_marked_done_in_one_call_each_prompt_along_the_table(client):
    # Given a queued, a dead, a done prompt and one the run does not have
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "q", "d", "f")
    store.put(letter("d"))
    ledger.mark_done("f", 1, "part-0.parquet")

    # When one group holding all four is marked stored in shard 1
    found = ledger.mark_group_done([("q", 5), ("d", 7), ("f", 9), ("x", 11)], "/out/r/part-1.parquet")

    # Then each moved as mark_done would move it, alone, and is counted once
    assert found == ["queued", "dead", "done", None]
    assert ledger.entries(["q", "d", "f", "x"]) == [
        Entry("done", shard=shard_code("part-1.parquet")), Entry("done", shard=shard_code("part-1.parquet")),
        Entry("done", shard=shard_code("part-0.parquet")), Entry()]
    tally = ledger.tally()
    assert (tally.done, tally.dead, tally.output_tokens, tally.reasons) == (3, 0, 1 + 5 + 7, {})
    assert ledger.canonical_rows("part-1.parquet") == 2 and store.get("d") is None
    assert ledger.recent()[0] == 3
    check_invariants(ledger, store, ["q", "d", "f"])


def test_a_writing_entry_lasts_from_before_the_write_until_its_prompt_is_done_or_dead(client):
    # Given three queued prompts whose samples are about to be written to shard A
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a", "b", "c")
    ledger.writing(["a", "b", "c"], "part-A.parquet")
    assert ledger.intake("a")[:2] == (pack_ids([1, 2, 3]), "part-A.parquet")

    # When the write fails and its retry names shard B for "b" only, a drop naming A spares it
    ledger.writing(["b"], "part-B.parquet")
    assert ledger.unwritten(["a", "b"], "part-A.parquet") == 1
    assert ledger.intake("a")[:2] == (pack_ids([1, 2, 3]), None) and ledger.intake("b")[1] == "part-B.parquet"

    # When "b" is stored and "c" dead-lettered, their entries go with their pending state
    ledger.mark_group_done([("b", 2)], "part-B.parquet")
    store.put(letter("c"))
    assert ledger.intake("b")[:2] == (None, None) and ledger.intake("c")[:2] == (None, None)
    assert not client.exists(RunKeys("r").writing)
    # and a delivery of a prompt that is done drops an entry its group left (its worker died)
    ledger.writing(["b"], "part-C.parquet")
    assert ledger.intake("b")[:2] == (None, None) and not client.exists(RunKeys("r").writing)
    check_invariants(ledger, store, ["a", "b", "c"])


def test_an_intake_notes_the_delivery_of_a_prompt_to_generate_until_as_many_as_allowed_are_noted(client):
    # Given a queued prompt, a dead one, and one whose sample was being written to a shard
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a", "d", "w")
    store.put(letter("d"))
    ledger.writing(["w"], "part-A.parquet")
    held = lambda pid: deliveries.holders(client, "r", pid)

    # When workers take "a" three times, at most two deliveries noted by the intake
    first, second, third = (ledger.intake("a", name, 2) for name in ("w1", "w2", "w3"))

    # Then the first two are noted in the same call, each seeing the ones before it,
    # and the third (its last chance, which the task notes only once it runs alone) is not
    assert (first.ids, first.held_by, first.noted) == (pack_ids([1, 2, 3]), [], True)
    assert (second.held_by, second.noted) == (["w1"], True)
    assert (third.held_by, third.noted) == (["w1", "w2"], False) and held("a") == ["w1", "w2"]
    # and a worker taken back removes its own line, as with a delivery noted by `note`
    deliveries.undo(client, "r", "a", "w2")
    assert held("a") == ["w1"]
    # and nothing is noted for a prompt not to be generated: dead, or its sample maybe in a shard
    assert not ledger.intake("d", "w1", 2).noted and held("d") == []
    assert not ledger.intake("w", "w1", 2).noted and held("w") == []
    # and an intake without a worker only reads
    assert ledger.intake("a")[:4] == (pack_ids([1, 2, 3]), None, [], False) and held("a") == ["w1"]
    check_invariants(ledger, store, ["a", "d", "w"])


def test_a_letter_is_forgotten_by_the_reason_the_ledger_kept_not_by_decoding_it(client):
    # Given a dead prompt whose stored letter is not JSON at all (the ledger never reads it)
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a", "b")
    assert ledger.bury("a", "aborted", "not json {") == "queued"
    assert ledger.bury("b", "truncated", letter("b", "truncated").to_json()) == "queued"

    # When one is stored after all and the other's letter is replaced by one of another reason
    assert ledger.mark_done("a", 1, "part-1.parquet") == "dead"
    assert store.put(letter("b", "aborted")) == "dead"

    # Then the counts by reason follow the reasons given, each letter counted once
    assert ledger.tally().reasons == {"aborted": 1}
    assert not client.hexists(RunKeys("r").dead_reasons, "a")
    check_invariants(ledger, store, ["a", "b"])


def test_enqueue_sends_a_script_call_per_chunk_of_prompts(client):
    # Given 2,500 new prompts
    ledger = Ledger(client, "r")
    pids = [f"p{i}" for i in range(2500)]
    client.config_resetstat()

    # When they are enqueued in one call
    outcomes = ledger.enqueue({p: pack_ids([1]) for p in pids}, 1)

    # Then each is queued, by a script call per READ_CHUNK (250) prompts: ten
    assert outcomes == [NEW] * 2500 and ledger.tally().queued == 2500
    stats = client.info("commandstats")
    assert sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("eval", "evalsha")) == 2500 // READ_CHUNK == 10


def test_a_letter_with_a_field_this_version_does_not_know_is_still_listed(client, caplog):
    # Given two letters a newer version wrote, with a field this one does not know
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    enqueue(ledger, "a", "b")
    for pid in ("a", "b"):
        ledger.bury(pid, "aborted", json.dumps({**letter(pid, "aborted").__dict__, "hint": "retry later"}))

    # When they are listed, then both are, without the field, and a warning names it once
    with caplog.at_level("WARNING", logger="contract.ledger.deadletters"):
        assert sorted(d.id for d in store) == ["a", "b"] and store.get("a").reason == "aborted"
    assert [r.getMessage() for r in caplog.records] == [
        "dead letters hold fields this version does not know, left out: hint"]


def test_dead_letters_are_listed_by_id_then_sample_the_same_every_time(client):
    # Given a run with letters written out of order, two of them samples of one prompt
    ledger, store = Ledger(client, "r"), DeadLetters(client, "r")
    ids = [f"p{n:03d}" for n in (42, 7, 300, 19, 1, 88)]
    enqueue(ledger, *ids, "p050~0", "p050~3")
    for pid in ids:
        store.put(letter(pid, "truncated" if pid in ("p007", "p300") else "missing_think_end"))
    for sample in (3, 0):
        store.put(replace(letter("p050"), sample=sample))

    # When they are listed, all and by reason
    listed = [(d.id, d.sample) for d in store.in_order()]
    truncated = [d.id for d in store.in_order(["truncated"])]

    # Then in the order of their ids, a prompt's samples by index, and again the same
    assert listed == sorted(listed, key=lambda k: (k[0], k[1] or 0)) and len(listed) == 8
    assert listed == [(d.id, d.sample) for d in store.in_order(page=2)]
    assert truncated == ["p007", "p300"]
