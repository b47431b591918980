"""The audit: a queued prompt whose message the broker lost is published again.

kombu's Redis transport takes a message off the queue (BRPOP) before it
records it as unacknowledged, so a connection that breaks in between, or a
Redis restart that loses its last writes, can drop a message. The ledger still
holds the prompt's token ids, so one worker at a time (a Redis lock) compares
the prompts a run still holds with the messages in its queue and in flight,
and with the prompts live workers list as held in their heartbeats (a crash
between kombu's take and its record, or a failover, can leave a prompt that a
live worker generates with no message anywhere: it is not lost, and starting
it again would generate it twice); a prompt missing from all three in two
audits in a row is republished. A worker that takes such a prompt while
another still generates it drops the duplicate (`deliveries.elsewhere`). Only runs
whose queue is short enough to list are audited, so a lost prompt of a deep
queue is found as the queue drains.

The same sweep moves on a conversation (`enqueue --turns all`) whose current
turn is stored but which has not moved past it in two audits in a row: its
worker died between storing the turn and queueing the next (`turns.py`), once
the run has at most `FLEET_AUDIT_MAX_QUEUE` conversations in progress (the
redelivery of the stored turn's message moves most such conversations on first).
"""
from __future__ import annotations

import logging
import threading

from celery import bootsteps

from contract import heartbeats, kombu_redis
from contract.codec import count_ids
from contract.keys import AUDIT_LOCK, RunKeys, task_id
from contract.ledger import Ledger
from contract.publish import publish_prompts
from contract.spec import run_queues

from . import turns
from .runtime import get_runtime
from .specs import cached_spec

log = logging.getLogger(__name__)


class LostMessageAudit(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._suspects = Suspects()
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
        """Republish the prompts confirmed lost; returns how many. The reads go in the order a
        message moves (queue, then a worker's unacknowledged set or its heartbeat, then done),
        so a message taken between two reads is seen in the later one; only one moved back
        (a lapsed lease restored to the queue) can be seen in neither, once (`Suspects`)."""
        client, prefix = rt.redis, rt.settings.queue_prefix
        queues, queued = run_queues(client, prefix), {}
        for run, queue in queues.items():
            self._resume_conversations(app, rt, run)
            if (client.hlen(RunKeys(run).token_ids)
                    and kombu_redis.queue_depth(client, queue) <= rt.settings.audit_max_queue):
                queued[run] = _task_ids(kombu_redis.queued_messages(client, queue))
        in_flight = _task_ids(kombu_redis.unacked_messages(client))
        held = heartbeats.held(client)
        self._suspects.keep_only(queued)
        republished = 0
        for run in queued:
            missing = {pid for pid in Ledger(client, run).pending_ids() - held.get(run, set())
                       if task_id(run, pid) not in queued[run] and task_id(run, pid) not in in_flight}
            republished += self._republish(app, client, run, queues[run], self._suspects.confirm(run, missing))
        return republished

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
        ordered = sorted(confirmed)
        payloads = client.hmget(RunKeys(run).token_ids, ordered)
        batch = [(pid, count_ids(raw), None) for pid, raw in zip(ordered, payloads) if raw]
        publish_prompts(app, run, queue, batch)
        log.warning("audit: republished %d prompts of run %s whose messages were lost: %s",
                    len(batch), run, ", ".join(p for p, _, _ in batch[:10]))
        return len(batch)


class Suspects:
    """Prompts an audit found with no message anywhere, per run, until the run's next audit.

    A prompt is confirmed lost only when the very next audit of its run still finds it
    missing: a message in passing (taken from the queue and not yet recorded as
    unacknowledged, or recorded by a producer and not yet published) is missing once. A run
    an audit skips (its queue too deep to list, or the run gone) forgets its suspects:
    otherwise prompts of a run's first batch, missing while the producer published it, could
    stay suspects while the queue is deep and be confirmed, and started twice, by one passing
    sighting minutes later.
    """

    def __init__(self) -> None:
        self._by_run: dict[str, set[str]] = {}

    def confirm(self, run: str, missing: set[str]) -> set[str]:
        """The prompts of `run` missing now and at the run's previous audit; the others
        missing now are the suspects of the next one."""
        confirmed = missing & self._by_run.get(run, set())
        self._by_run[run] = missing - confirmed
        return confirmed

    def keep_only(self, runs) -> None:
        """Forget the suspects of every run not among `runs` (the runs audited now)."""
        for run in set(self._by_run) - set(runs):
            del self._by_run[run]


def _task_ids(messages) -> set[str]:
    ids = set()
    for message in messages:
        headers = message.get("headers") or {}
        if headers.get("id"):
            ids.add(headers["id"])
    return ids
