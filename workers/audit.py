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
import time

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
        self._suspects: dict[tuple[str, str], float] = {}
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
        client, prefix = rt.redis, rt.settings.queue_prefix
        in_flight = _task_ids(kombu_redis.unacked_messages(client))
        held = heartbeats.held(client)
        republished = 0
        for run, queue in run_queues(client, prefix).items():
            self._resume_conversations(app, rt, run)
            if (not client.hlen(RunKeys(run).token_ids)
                    or kombu_redis.queue_depth(client, queue) > rt.settings.audit_max_queue):
                continue
            queued = _task_ids(kombu_redis.queued_messages(client, queue))
            missing = {pid for pid in Ledger(client, run).pending_ids() - held.get(run, set())
                       if task_id(run, pid) not in queued and task_id(run, pid) not in in_flight}
            republished += self._republish(app, client, run, queue, missing)
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

    def _republish(self, app, client, run: str, queue: str, missing: set[str]) -> int:
        now = time.monotonic()
        keys = {(run, pid) for pid in missing}
        for key in [k for k in self._suspects if k[0] == run and k not in keys]:
            del self._suspects[key]
        confirmed = sorted(pid for r, pid in keys if (r, pid) in self._suspects)
        for key in keys:
            self._suspects.setdefault(key, now)
        if not confirmed:
            return 0
        payloads = client.hmget(RunKeys(run).token_ids, confirmed)
        batch = [(pid, count_ids(raw), None) for pid, raw in zip(confirmed, payloads) if raw]
        publish_prompts(app, run, queue, batch)
        for pid in confirmed:
            self._suspects.pop((run, pid), None)
        log.warning("audit: republished %d prompts of run %s whose messages were lost: %s",
                    len(batch), run, ", ".join(p for p, _, _ in batch[:10]))
        return len(batch)


def _task_ids(messages) -> set[str]:
    ids = set()
    for message in messages:
        headers = message.get("headers") or {}
        if headers.get("id"):
            ids.add(headers["id"])
    return ids
