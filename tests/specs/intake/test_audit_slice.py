"""A round of the audit reads a bounded slice: a slice of pending prompts, and about `FLEET_AUDIT_HEARTBEATS`
workers' heartbeats, however many workers the run's prompts name.

Given a run's pending prompts, each named in its deliveries entry to one of many
workers, a round reads prompts from the pass's cursor until it has read the
slice or their entries name the bound's workers, and the next round goes on
from where it stopped: the rounds of a pass together judge every pending prompt,
none skipped. The suspects of the round before come first and count toward the
bound. A prompt in its queue is not judged; one with no entry names no worker.
Through the audit's own round (`LostMessageAudit.audit_run`), with live workers
that list what they hold: a lost prompt is republished within a pass and one
round, and a held one never.
"""
from __future__ import annotations

from contract.fleet import heartbeats
from contract.redis_link.clock import CLOCK
from contract.keys import RunKeys, task_id
from contract.ledger.ledger import Ledger
from workers.intake.audit import AuditState, LostMessageAudit
from workers.intake.audit_slice import PAGE, Slice
from workers.settings import Settings

RUN, QUEUE = "run", "fleet.generate.run"


def held_fleet(client, workers: int, each: int) -> dict[str, list[str]]:
    """`workers` workers holding `each` pending prompts apiece, every one named in its entry."""
    holding = {f"w-{w:03d}@node": [f"p-{w:03d}-{i:02d}" for i in range(each)] for w in range(workers)}
    everyone = [pid for pids in holding.values() for pid in pids]
    Ledger(client, RUN).enqueue([(pid, b"\x01\x02") for pid in everyone], call="spec")
    for worker, pids in holding.items():
        client.hset(RunKeys(RUN).deliveries, mapping=dict.fromkeys(pids, worker))
    return holding


def test_a_round_stops_at_the_bound_on_workers_and_the_next_goes_on_from_there(client):
    # Given 2,000 pending prompts held by 400 workers, 5 each
    held_fleet(client, 400, 5)
    ledger, judged, rounds, cursor = Ledger(client, RUN), [], 0, 0
    # When rounds of a slice of 1,500 with a bound of 50 heartbeats go over the run until the pass is over
    while True:
        looked = Slice(client, RUN, queued=set())
        cursor = looked.extend(ledger, cursor, 1500, heartbeats=50)
        rounds += 1
        # Then no round names more than the bound and one page's workers
        assert len(looked.workers) < 50 + 2 * PAGE
        judged += list(looked.candidates)
        if cursor == 0:
            break
    # and the rounds together judged every pending prompt, once each, in more rounds than the slice alone needs
    assert sorted(judged) == sorted(set(judged)) and len(judged) == 2000
    assert rounds > 2000 // 1500 + 1


def test_a_round_reads_its_whole_slice_while_its_prompts_name_few_workers(client):
    # Given 2,000 pending prompts held by 4 workers
    held_fleet(client, 4, 500)
    # When a round reads a slice of 1,500 with a bound of 50 heartbeats
    looked = Slice(client, RUN, queued=set())
    cursor = looked.extend(Ledger(client, RUN), 0, 1500, heartbeats=50)
    # Then the bound never bites: about the whole slice is judged (HSCAN's pages are approximate), 4 workers named
    assert cursor != 0 and 1500 <= len(looked.candidates) < 1500 + 2 * PAGE and len(looked.workers) == 4


def test_the_suspects_come_first_and_count_toward_the_bound(client):
    # Given 400 workers' prompts, and last round's suspects naming 60 workers
    holding = held_fleet(client, 400, 5)
    suspects = [pids[0] for pids in list(holding.values())[:60]]
    ledger = Ledger(client, RUN)
    cursor = Slice(client, RUN, queued=set()).extend(ledger, 0, 1500, heartbeats=10)  # a pass under way
    # When a round with a bound of 50 heartbeats looks at the suspects first
    looked = Slice(client, RUN, queued=set())
    looked.add(suspects)
    # Then every suspect is judged, and the pass does not move on this round
    assert looked.extend(ledger, cursor, 1500, heartbeats=50) == cursor != 0
    assert list(looked.candidates) == suspects


def test_a_queued_prompt_is_not_judged_and_one_with_no_entry_names_no_worker(client):
    held_fleet(client, 1, 2)
    Ledger(client, RUN).enqueue([("new", b"\x01")], call="spec")
    looked = Slice(client, RUN, queued={task_id(RUN, "p-000-00")})
    looked.add(["p-000-00", "p-000-01", "new"])
    assert list(looked.candidates) == ["p-000-01", "new"]
    assert looked.named == {"p-000-01": ["w-000@node"]} and looked.workers == {"w-000@node"}


class Audit(LostMessageAudit):
    """The audit's rounds alone (no consumer); what it republishes is recorded, not published."""

    def __init__(self, found: set[str]):
        self._stalled, self.found = {}, found

    def _republish(self, app, client, run, queue, confirmed):
        self.found.update(confirmed)
        return len(confirmed)


def test_rounds_bounded_on_workers_find_every_lost_prompt_within_a_pass_and_republish_no_held_one(client):
    # Given 400 live workers (started long ago) holding 5 prompts each and listing them in their
    # heartbeats, and 10 lost prompts: 5 with no entry, 5 named to a live worker that does not list them
    holding = held_fleet(client, 400, 5)
    lost = [f"lost-{i}" for i in range(5)]
    stale = [f"stale-{i}" for i in range(5)]
    Ledger(client, RUN).enqueue([(pid, b"\x01") for pid in lost + stale], call="spec")
    client.hset(RunKeys(RUN).deliveries, mapping=dict.fromkeys(stale, "w-000@node"))
    started = CLOCK.now(client) - 86_400
    for worker, pids in holding.items():
        heartbeats.publish(client, worker, [], ttl=600, holding=lambda pids=pids: {RUN: pids}, started=started)
    # When the audit's rounds, a slice of 1,000 and at most 50 heartbeats each, run over two passes
    found: set[str] = set()
    audit, state = Audit(found), AuditState(client, RUN, fresh=1e9)
    rt = type("Runtime", (), {"redis": client, "settings": Settings(audit_slice=1000, audit_heartbeats=50)})()
    passes = rounds = 0
    while passes < 2:
        audit.audit_run(None, rt, RUN, QUEUE, state)
        rounds += 1
        passes += state.read()[0] == 0
    # Then every lost prompt was confirmed, and no held one
    assert found == set(lost + stale), (rounds, sorted(found)[:5])
    # and each round stopped at the heartbeats' bound, well before its slice: a pass of its 2,010
    # prompts took more than the 3 rounds whole slices take (the bound as the audit read it)
    assert rounds > 2 * 4, rounds
