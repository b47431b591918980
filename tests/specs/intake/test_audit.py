"""The audit's rule for a lost message: missing at two audits of its run in a row, never longer apart,
its deliveries entry unchanged in between.

A prompt whose message is in passing (taken from the queue and not yet
recorded as unacknowledged, or recorded by a producer and not yet published)
is missing from every list once; a prompt missing twice in a row lost its
message, unless it was noted or given back in between (its entry changed: a
live worker is cycling it, `test_audit_cycle.py`). Given what successive
audits of a run find missing, then the prompts confirmed lost are exactly
those missing at the run's previous audit and now with the same entry, and
an audit that skipped the run (its queue too deep to list), or
came longer after the one before than two rounds apart, ends every earlier
sighting of it. The suspects and the pass's cursor are kept in Redis
(`AuditState`), so the next round confirms whichever worker holds the lock.

Where a message not in its queue may be (`accounted.accounts`): with a worker
the prompt's deliveries entry names, if that worker is live and lists it, or
was heard from or started within the window (a lease, a sweep and rounds), or
is silent while kombu's sweep still has a message to bring back
(`accounted.restores_pending`: a lease no worker renews), which may be the
prompt's: republished as well, the prompt would be on its queue twice.
"""
from __future__ import annotations

from contract.keys import LEASES, RunKeys
from contract.broker.kombu_redis import UNACKED_INDEX, expire
from contract.broker.worker_lease import Holder
from workers.intake.accounted import accounts, entries, restores_pending, stored_entries
from workers.intake.deliveries import clear, note, undo
from workers.intake.audit import AuditState, Suspects

from waiting import wait_until


def test_a_prompt_missing_once_is_not_republished():
    # Given a first audit that finds p-1 missing
    suspects = Suspects()
    # When it is the first sighting, then nothing is confirmed
    assert suspects.confirm("run", {"p-1": ""}) == set()
    # and when the next audit finds it again (its message came in the meantime), still nothing
    assert suspects.confirm("run", {}) == set()
    assert suspects.confirm("run", {"p-1": ""}) == set()


def test_a_prompt_missing_at_two_audits_in_a_row_is_confirmed_once():
    # Given p-1 and p-2 missing at one audit
    suspects = Suspects()
    suspects.confirm("run", {"p-1": "", "p-2": ""})
    # When the next audit finds p-1 (and a new p-3) missing
    confirmed = suspects.confirm("run", {"p-1": "", "p-3": ""})
    # Then p-1 is confirmed lost, p-3 is a suspect, p-2 is forgotten
    assert confirmed == {"p-1"}
    assert suspects.confirm("run", {"p-2": "", "p-3": ""}) == {"p-3"}
    # and a confirmed prompt (republished) starts over: one more sighting does not confirm it
    assert suspects.confirm("run", {"p-1": ""}) == set()


def test_a_prompt_noted_and_given_back_between_two_audits_is_a_suspect_again(client):
    # Given p-1 missing at one audit, its deliveries entry as read then (none yet)
    seen = lambda: stored_entries(client, "run", ["p-1"])[0]
    suspects = Suspects()
    suspects.confirm("run", {"p-1": seen()})
    # When a live worker notes it and gives it back before the next audit finds it missing again
    note(client, "run", "p-1", "w1@node")
    undo(client, "run", "p-1", "w1@node")
    # Then its entry names no worker, as before, yet it moved: not confirmed, but a suspect with
    # its entry as read now, confirmed if it stays so
    assert entries(client, "run", ["p-1"]) == [[]]
    assert suspects.confirm("run", {"p-1": seen()}) == set()
    assert suspects.confirm("run", {"p-1": seen()}) == {"p-1"}
    # and once the prompt is finished its entry goes, and a late undo does not bring it back
    clear(client, "run", "p-1")
    undo(client, "run", "p-1", "w1@node")
    assert not client.hexists(RunKeys("run").deliveries, "p-1")


def test_a_skipped_audit_ends_the_runs_earlier_sightings(client):
    # Given p-1 of run a and p-9 of run b missing at one round, kept in Redis with each run's pass
    a, b = AuditState(client, "a", fresh=60), AuditState(client, "b", fresh=60)
    a.write(7, {"p-1": ""})
    b.write(3, {"p-9": "w1@node"})
    # When the next round skips run a (its queue too deep to list) and audits run b
    a.forget()
    # Then a later sighting of p-1 is its first again, while run b's confirmation stands
    cursor, suspects = b.read()
    assert cursor == 3 and Suspects({"b": suspects}).confirm("b", {"p-9": "w1@node"}) == {"p-9"}
    assert a.read() == (0, {})


def test_sightings_further_apart_than_two_rounds_do_not_confirm(client):
    # Given p-1 missing at a round that is now older than the state stays fresh
    state = AuditState(client, "a", fresh=0.2)
    state.write(5, {"p-1": ""})
    wait_until(lambda: state.read()[1] == {}, 10, "the round to age")
    # Then the pass goes on where it was, but p-1's next sighting is its first
    assert state.read() == (5, {})


def test_runs_do_not_confirm_each_others_prompts():
    suspects = Suspects()
    suspects.confirm("a", {"p-1": ""})
    assert suspects.confirm("b", {"p-1": ""}) == set()


WINDOW = 150.0


def test_a_live_worker_accounts_for_the_prompts_it_lists():
    record = {"started": 0.0}
    assert accounts("p-1", record, {"p-1"}, 1000.0, now=1000.0, window=WINDOW)
    # but not for one it does not list, once it has run longer than the window
    assert not accounts("p-2", record, {"p-1"}, 1000.0, now=1000.0, window=WINDOW)


def test_a_worker_restarted_under_the_same_name_accounts_for_its_predecessors_prompts_for_a_window():
    # (the predecessor's leases run out and its messages go back to the queue within the window)
    record = {"started": 900.0}
    assert accounts("p-2", record, set(), 1000.0, now=1000.0, window=WINDOW)
    assert not accounts("p-2", record, set(), 1100.0, now=1100.0, window=WINDOW)


def test_a_silent_worker_accounts_for_its_prompts_until_its_leases_must_have_run_out():
    assert accounts("p-1", None, set(), last_seen=900.0, now=1000.0, window=WINDOW)
    assert not accounts("p-1", None, set(), last_seen=800.0, now=1000.0, window=WINDOW)
    assert not accounts("p-1", None, set(), last_seen=None, now=1000.0, window=WINDOW)


def test_a_silent_worker_accounts_for_its_prompts_while_the_sweep_has_messages_to_bring_back():
    # Given a worker named in the prompt's entry, silent for longer than the window (or never heard of)
    # When kombu's sweep still has a message to bring back, it may be this prompt's: accounted for
    assert accounts("p-1", None, set(), last_seen=800.0, now=1000.0, window=WINDOW, restoring=True)
    assert accounts("p-1", None, set(), last_seen=None, now=1000.0, window=WINDOW, restoring=True)
    # and once the sweep has brought every one back, it is missing
    assert not accounts("p-1", None, set(), last_seen=800.0, now=1000.0, window=WINDOW, restoring=False)


def test_the_sweep_has_a_message_to_bring_back_once_a_lease_goes_half_a_lease_unrenewed(client):
    # Given leases of a live worker, renewed every quarter lease (a lease of 120 s)
    client.zadd(UNACKED_INDEX, {"fresh": 1000.0, "renewed": 1000.0 - 30.0})
    assert not restores_pending(client, now=1000.0, lease_seconds=120.0)

    # When one goes half a lease without renewal (its worker died or hangs), kombu will restore it
    assert restores_pending(client, now=1000.0 + 61.0, lease_seconds=120.0)

    # and so it will one a worker handed back (its lease expired at once)
    client.zadd(UNACKED_INDEX, {"renewed": 1000.0})
    assert not restores_pending(client, now=1000.0, lease_seconds=120.0)
    expire(client, ["fresh"])
    assert restores_pending(client, now=1000.0, lease_seconds=120.0)


def test_the_sweep_has_a_message_to_bring_back_once_a_workers_lease_goes_half_a_lease_unrenewed(client):
    # Given deliveries held under a worker's lease, renewed a quarter lease ago
    holder = Holder.draw()
    client.zadd(LEASES, {holder.name: 1000.0 - 30.0})
    client.zadd(UNACKED_INDEX, {"held": holder.score})
    assert not restores_pending(client, now=1000.0, lease_seconds=120.0)

    # When the worker goes half a lease without a round, a live worker will hand its deliveries to the sweep
    assert restores_pending(client, now=1000.0 + 31.0, lease_seconds=120.0)
