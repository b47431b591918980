"""The audit: a queued prompt whose message the broker lost is published again.

kombu's Redis transport takes a message off the queue (BRPOP) before it
records it as unacknowledged, so a connection that breaks in between, or a
Redis restart that loses its last writes, can drop a message. The ledger still
holds the prompt's token ids, so one worker at a time (a Redis lock) looks at
the prompts a run still holds, a slice of them per round (`FLEET_AUDIT_SLICE`,
a cursor over the run's pending prompts kept in Redis, so the pass goes on
whichever worker holds the lock), and finds where each one's message is: in
its queue, or with a worker its deliveries entry names (`accounted.py`: held
by a live worker, or in passing with one that died or restarted moments ago, or
with a silent one while kombu's sweep still has messages to bring back;
a crash between kombu's take and its record, or a failover, can leave a
prompt that a live worker generates with no message anywhere: it is not lost,
and starting it again would generate it twice). A prompt missing from all of
them in two rounds in a row, its deliveries entry unchanged in between (the
run's suspects are kept in Redis with the pass, each with its entry as read;
a live worker that keeps taking and giving the prompt back, missing for moments
at each turn, changes it every time: `Suspects`) is republished (one on its
last allowed delivery, which waits in its worker before its note, once no live
worker's heartbeat lists it: the only read of every heartbeat, and a rare
one; a prompt a `dead requeue --max-new-tokens` gave its budget is generated
with it whatever message brings it: the intake reads it from the ledger,
`RunKeys.budgets`). A worker that takes such a prompt while another
still generates it drops the duplicate (`deliveries.elsewhere`). Only runs
whose queue is short enough to list are audited, so a lost prompt of a deep
queue is found as the queue drains.

Every read is a bounded slice (a page of HSCAN of 100 prompts, of LRANGE of 200
messages, of HMGET of 500 fields, of MGET of 50 heartbeats), so no command of
the audit blocks Redis for long, and a round reads at most a slice of prompts
and about `FLEET_AUDIT_HEARTBEATS` (500) heartbeats, whatever the fleet's size
or what is in flight (`audit_slice.py`: a round stops early where its prompts
name that many workers, and the next goes on from there). A pass takes
pending / slice rounds where the prompts name few workers, about pending / 700
at 1,000 workers and up to pending / 500 beyond (at 10^6 prompts in flight on
4,000 workers, about 1,900 rounds: 16 hours at the default 30 s, where whole
slices took 200 rounds, 100 minutes, at ~20 ms a round instead of ~4). A
run's last prompts are looked at every round once they are fewer than a slice
and name fewer workers than the bound, so a run's end is never held up for long.

The same sweep moves on a conversation (`enqueue --turns all`) whose current
turn is stored but which has not moved past it in two audits in a row: its
worker died between storing the turn and queueing the next (`workers/output/turns.py`), once
the run has at most `FLEET_AUDIT_MAX_QUEUE` conversations in progress (the
redelivery of the stored turn's message moves most such conversations on first).
"""
from __future__ import annotations

import json
import logging
import threading

from celery import bootsteps

from contract.fleet import heartbeats
from contract.broker import kombu_redis
from contract.redis_link.clock import CLOCK
from contract.ledger.codec import count_ids
from contract.keys import AUDIT_LOCK, AUDIT_PREFIX, RunKeys
from contract.ledger.ledger import Ledger
from contract.broker.publish import publish_prompts
from contract.run.spec import run_queues
from contract.counts import counted

from ..output import turns
from .accounted import accounted_for, entries, restores_pending
from .audit_slice import PAGE, Slice
from .runtime import get_runtime
from .specs import cached_spec

log = logging.getLogger(__name__)


class LostMessageAudit(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._stalled: dict[str, set[str]] = {}  # run -> conversation turns stored but not moved past

    def start(self, c) -> None:
        self._stop.clear()
        threading.Thread(target=self._run, args=(c,), name="fleet-audit", daemon=True).start()

    def stop(self, c) -> None:
        self._stop.set()

    def _run(self, c) -> None:
        rt = get_runtime(c.app.fleet_settings, c.hostname)
        interval = rt.settings.audit_interval
        while not self._stop.wait(interval):
            try:
                if rt.redis.set(AUDIT_LOCK, rt.worker, nx=True, ex=max(1, int(interval))):
                    self.audit(c.app, rt)
            except Exception as exc:  # the broker may be restarting: try next time
                log.warning("lost-message audit skipped: %r", exc)

    def audit(self, app, rt) -> int:
        """Republish the prompts confirmed lost, of every run with a queue short enough to list;
        returns how many."""
        client, s = rt.redis, rt.settings
        republished = 0
        for run, queue in run_queues(client, s.queue_prefix).items():
            self._resume_conversations(app, rt, run)
            state = AuditState(client, run, fresh=2.5 * s.audit_interval)
            if not client.hlen(RunKeys(run).token_ids) or kombu_redis.queue_depth(client, queue) > s.audit_max_queue:
                state.forget()  # a run it skips forgets its suspects (`Suspects`)
                continue
            republished += self.audit_run(app, rt, run, queue, state)
        return republished

    def audit_run(self, app, rt, run: str, queue: str, state: "AuditState") -> int:
        """One round of a run. The reads go in the order a message moves (queue, then a worker,
        then done), so a prompt noted between two reads is seen in the later one; one in passing
        can be seen in neither: taken by kombu and not yet noted, or moved back (given back and
        not yet requeued, a lapsed lease restored to the queue). That is once, or once a turn
        for a prompt a live worker keeps taking and giving back, its entry changed at each turn
        (`Suspects`)."""
        client, s, ledger = rt.redis, rt.settings, Ledger(rt.redis, run)
        cursor, suspects = state.read()
        # before the queue: a message the sweep restores after this read is in the queue, or taken, by then
        restoring = restores_pending(client, CLOCK.now(client), s.lease_seconds)
        looked = Slice(client, run, _task_ids(kombu_redis.queued_messages(client, queue)))
        looked.add(sorted(suspects))  # first: the next sighting of a suspect is never put off
        cursor = looked.extend(ledger, cursor, s.audit_slice, s.audit_heartbeats)
        window = s.lease_seconds + s.restore_interval + 2 * s.audit_interval
        held = accounted_for(client, run, looked.named, window, restoring)
        unaccounted = [p for p in looked.candidates if p not in held]
        missing = {p: looked.candidates[p] for p, pending in zip(unaccounted, ledger.pending(unaccounted)) if pending}
        confirmed = Suspects({run: suspects}).confirm(run, missing)
        if last_chance(client, run, confirmed, s.max_deliveries):  # rare: read every live heartbeat
            confirmed -= heartbeats.held(client).get(run, set())
        state.write(cursor, {p: entry for p, entry in missing.items() if p not in confirmed})
        return self._republish(app, client, run, queue, confirmed)

    def _resume_conversations(self, app, rt, run: str) -> None:
        """A conversation whose current turn is stored but which has not moved on in two audits
        in a row lost its worker between the two steps: move it on here."""
        try:
            spec = cached_spec(rt.settings.redis_url, run)
        except LookupError:
            return
        if spec.turns != "all" or rt.redis.hlen(RunKeys(run).conversation_at) > rt.settings.audit_max_queue:
            return  # a run with more conversations in progress is swept as it drains
        found = turns.stalled(rt, spec)
        turns.resume(app, rt, spec, found & self._stalled.get(run, set()))
        self._stalled[run] = found

    def _republish(self, app, client, run: str, queue: str, confirmed: set[str]) -> int:
        if not confirmed:
            return 0
        ordered, batch = sorted(confirmed), []
        for start in range(0, len(ordered), PAGE):  # packed ids: a page at a time
            page = ordered[start:start + PAGE]
            batch += [(pid, count_ids(raw), None) for pid, raw in zip(page, client.hmget(RunKeys(run).token_ids, page))
                      if raw]
        publish_prompts(app, run, queue, batch)
        shown = ", ".join(p for p, _, _ in batch[:10]) + (f" and {len(batch) - 10} more" if len(batch) > 10 else "")
        log.warning("audit: republished %s of run %s whose messages were lost: %s",
                    counted(len(batch), "prompt"), run, shown)
        return len(batch)


def last_chance(client, run: str, prompt_ids: set[str], most: int) -> bool:
    """Whether one of these prompts is on its last allowed delivery (`deliveries.py`): that one
    waits in its worker, listed in its heartbeat but not yet noted, to run alone."""
    return any(len(names) >= most for names in entries(client, run, sorted(prompt_ids)))


class AuditState:
    """A run's audit between rounds, in Redis (whichever worker holds the lock goes on): the
    cursor of its pass over the pending prompts, and the prompts the last round found missing,
    each with its deliveries entry as read then, forgotten when that round is older than `fresh`
    seconds (two rounds in a row, never longer apart: `Suspects`)."""

    def __init__(self, client, run: str, fresh: float):
        self.client, self.key, self.fresh = client, AUDIT_PREFIX + run, fresh

    def read(self) -> tuple[int, dict[str, str]]:
        cursor, suspects, at = self.client.hmget(self.key, ["cursor", "suspects", "at"])
        recent = at is not None and CLOCK.now(self.client) - float(at) <= self.fresh
        found = json.loads(suspects) if suspects and recent else {}
        return int(cursor or 0), found if isinstance(found, dict) else {}  # a list: an older version's, seen afresh

    def write(self, cursor: int, suspects: dict[str, str]) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(self.key, mapping={"cursor": cursor, "suspects": json.dumps(suspects, sort_keys=True),
                                         "at": CLOCK.now(self.client)})
            pipe.expire(self.key, max(1, int(4 * self.fresh)))
            pipe.execute()

    def forget(self) -> None:
        self.client.delete(self.key)


class Suspects:
    """Prompts an audit found with no message anywhere, per run, until the run's next audit,
    each with its deliveries entry as that audit read it.

    A prompt is confirmed lost only when the very next audit of its run still finds it
    missing, its entry unchanged: a message in passing (taken from the queue and not yet
    recorded as unacknowledged, or recorded by a producer and not yet published) is missing
    once; a prompt that a live worker keeps taking and giving back (no usable server) is
    missing for moments twice a turn, between kombu's take and the intake's note and
    between the give-back's undo and kombu's requeue, and audits as far apart as a turn is
    long can fall into those moments round after round. Its entry changes at every note and
    every give-back (`contract/ledger/deliveries.py`), so a prompt given back between two sightings
    is a suspect again, with its entry as now read, not confirmed. A lost message moves
    nothing: its prompt's entry stays as it was, and the next audit confirms it (one after,
    where the prompt was taken and given back just before its message was lost).
    What the entry cannot show is a message requeued and taken again with no note in between:
    a prompt seen just after a give-back and, a round later, just after kombu's next take,
    having waited in its queue all that while and been taken within the milliseconds
    between the audit's read of the queue and of the entries. Republished then, its
    duplicate is dropped by the worker that takes it (`deliveries.elsewhere`).

    A run an audit skips (its queue too deep to list, or the run gone) forgets its suspects:
    otherwise prompts of a run's first batch, missing while the producer published it, could
    stay suspects while the queue is deep and be confirmed, and started twice, by one passing
    sighting minutes later.
    """

    def __init__(self, by_run: dict[str, dict[str, str]] | None = None) -> None:
        self._by_run: dict[str, dict[str, str]] = {run: dict(found) for run, found in (by_run or {}).items()}

    def confirm(self, run: str, missing: dict[str, str]) -> set[str]:
        """The prompts of `run` missing now (prompt -> its entry as read now) and at the run's
        previous audit with the same entry; the others missing now are the suspects of the next one."""
        earlier = self._by_run.get(run, {})
        confirmed = {p for p, entry in missing.items() if earlier.get(p) == entry}
        self._by_run[run] = {p: entry for p, entry in missing.items() if p not in confirmed}
        return confirmed


def _task_ids(messages) -> set[str]:
    ids = set()
    for message in messages:
        headers = message.get("headers") or {}
        if headers.get("id"):
            ids.add(headers["id"])
    return ids
