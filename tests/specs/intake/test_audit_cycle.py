"""A prompt that a live worker keeps taking and giving back is never confirmed lost, however its audits fall.

A worker with no usable server takes a prompt, waits for a server, gives it back
and takes it again. Twice a cycle the prompt is neither in its queue nor named
by its deliveries entry: (a) between kombu's take and the intake's note, and
(b) between the give-back's undo of that note and kombu's requeue. Given audit
rounds as far apart as the cycle is long, both rounds of a pair can fall into
those gaps; then the prompt was missing at two audits in a row, yet it moved in
between (it was given back), so it is a suspect again, not confirmed: nothing
is republished. A prompt whose message is truly lost does not move: it is
confirmed at its second sighting, or, where it moved just before its message was
lost, at the one after.

Through the audit's own round (`LostMessageAudit.audit_run`) on real Redis, the
worker's steps as a worker takes them: kombu's take and requeue on the queue's
list, the intake's note (`Ledger.intake`), the heartbeat that lists the prompt
while it is held, and the give-back's undo (`deliveries.undo`).
"""
from __future__ import annotations

import json

import pytest

from contract.fleet import heartbeats
from contract.redis_link.clock import CLOCK
from contract.keys import task_id
from contract.ledger.ledger import Ledger
from workers.intake import deliveries
from workers.intake.audit import AuditState, LostMessageAudit
from workers.settings import Settings

RUN, QUEUE, PROMPT, WORKER = "run", "fleet.generate.run", "p-1", "w1@node"


class Audit(LostMessageAudit):
    """The audit's rounds alone (no consumer); what it republishes is recorded, not published."""

    def __init__(self, client):
        self._stalled, self.republished = {}, []
        self.rt = type("Runtime", (), {"redis": client, "settings": Settings()})()
        self.state = AuditState(client, RUN, fresh=1e9)

    def round(self) -> None:
        self.audit_run(None, self.rt, RUN, QUEUE, self.state)

    def _republish(self, app, client, run, queue, confirmed):
        self.republished += sorted(confirmed)
        return len(confirmed)


class CyclingWorker:
    """A live worker (started long ago) with no usable server, cycling one prompt."""

    def __init__(self, client):
        self.client, self.holding, self.message = client, [], None
        self.started = CLOCK.now(client) - 86_400
        self.beat()

    def beat(self) -> None:
        heartbeats.publish(self.client, WORKER, [], ttl=600, holding=lambda: {RUN: list(self.holding)},
                           started=self.started)

    def take(self) -> None:
        """kombu takes the message: gap (a) begins."""
        self.message = self.client.rpop(QUEUE)
        assert self.message is not None

    def note(self) -> None:
        """The intake notes the delivery, listed as held from just before: gap (a) ends."""
        self.holding = [PROMPT]
        assert Ledger(self.client, RUN).intake(PROMPT, WORKER, most=5).noted
        self.beat()

    def undo(self) -> None:
        """No server came: the delivery is taken back (gap (b) begins), no longer listed."""
        self.holding = []
        deliveries.undo(self.client, RUN, PROMPT, WORKER)
        self.beat()

    def requeue(self) -> None:
        """kombu puts the message back on its queue: gap (b) ends."""
        self.client.lpush(QUEUE, self.message)


@pytest.fixture
def cycle(client):
    Ledger(client, RUN).enqueue([(PROMPT, b"\x01\x02")], call="spec")
    client.lpush(QUEUE, json.dumps({"headers": {"id": task_id(RUN, PROMPT)}, "body": ""}))
    return CyclingWorker(client), Audit(client)


def in_gap_a(worker: CyclingWorker, audit: Audit) -> None:
    """A whole cycle whose audit round falls between kombu's take and the note."""
    worker.take()
    audit.round()
    worker.note()
    worker.undo()
    worker.requeue()


def in_gap_b(worker: CyclingWorker, audit: Audit) -> None:
    """A whole cycle whose audit round falls between the undo and kombu's requeue."""
    worker.take()
    worker.note()
    worker.undo()
    audit.round()
    worker.requeue()


@pytest.mark.parametrize("gap", [in_gap_a, in_gap_b], ids=["at-its-take", "at-its-give-back"])
def test_a_prompt_cycled_by_a_live_worker_is_never_republished(cycle, gap):
    worker, audit = cycle
    # Given a live worker cycling a prompt, and audit rounds as far apart as its cycle is long,
    # each falling into the same gap of its cycle
    for _ in range(4):
        gap(worker, audit)
    # Then the prompt, missing at every round, is never confirmed lost: it moved between each two
    assert audit.republished == []


def test_rounds_at_its_take_and_at_its_give_back_do_not_confirm_it(cycle):
    worker, audit = cycle
    # Given one round between kombu's take and the note, and the next between the undo and the requeue
    worker.take()
    audit.round()
    worker.note()
    worker.undo()
    audit.round()
    worker.requeue()
    # Then nothing is republished
    assert audit.republished == []


def test_a_prompt_whose_message_is_lost_is_republished_at_its_second_sighting(cycle):
    worker, audit = cycle
    # Given a prompt whose message kombu took and lost (a broken connection) before any note
    worker.take()
    # When two rounds find it missing
    audit.round()
    assert audit.republished == []
    audit.round()
    # Then the second confirms it lost
    assert audit.republished == [PROMPT]


def test_a_prompt_lost_right_after_it_moved_is_republished_one_round_later(cycle):
    worker, audit = cycle
    # Given a round that finds the prompt missing while it is given back
    in_gap_b(worker, audit)
    # When a worker takes it again and gives it back, and its message is lost before the requeue
    worker.take()
    worker.note()
    worker.undo()
    # Then the next round sees it moved (not confirmed), and the one after confirms it lost
    audit.round()
    assert audit.republished == []
    audit.round()
    assert audit.republished == [PROMPT]
