"""After a failover, a worker moves to the new primary at once and asserts there what it holds and stored.

Sentinel promotes a replica, but nothing tells the clients: redis-py's
Sentinel pool asks where the primary is only when it opens a connection, so a
worker's pooled connections, and kombu's, keep writing to the old primary for
as long as it takes writes. After a `SENTINEL FAILOVER` that is until the
Sentinels demote it, seconds later; a primary frozen past
`down-after-milliseconds` wakes up still believing it is one. What it takes
meanwhile (delivery notes, acknowledgements, messages handed out) its resync
from the new primary drops. Done marks and writing entries are safe on their
own (confirmed on a replica, `contract/redis_link/replication.py`), and so is a prompt
taken from the old primary in its last second: where the primary has
replicas, a prompt is generated only once a replica has its delivery's note,
and so kombu's take of its message (`confirmed_intake.py`; one that met the
failover is taken in again on the new primary, where the notes decide who
generates it). The rest is this module's:

- a thread asks the Sentinels every `FLEET_FAILOVER_CHECK_INTERVAL` where the
  primary is (one short command to one Sentinel);
- when it moved, every Sentinel pool of the process (the worker's own and
  every one kombu built, publishing included: `transport.sentinel_pools`)
  drops its idle connections, so the next command goes to the new primary;
- then the worker asserts on the new primary what a live worker holds and
  stored: its deliveries of the prompts it holds past their intake
  (`deliveries.hold`, so a second message of such a prompt there is not
  generated again by another worker: `deliveries.elsewhere`; an intake in
  progress notes its own, and a note written here for it would put this
  worker before another that noted the prompt first), its groups' done marks
  of the last `recent.REMEMBER_S` seconds (idempotent), the conversations it
  moved past a stored turn in that time (`turns.advance`, which does nothing
  where they are past it: a next turn queued on the old primary only would
  otherwise wait for the audit, and be generated again), and its
  acknowledgements of that time (a message whose ack was lost would come back
  one lease later); and its next heartbeat is written at once (it lists the
  held prompts);
- only then does its consumer reconnect (the consumer's timer raises a
  connection error in the event loop, Celery's own way back; the deliveries
  it holds stay with it, `workers/intake/consumer.py`), so it takes messages from the
  new primary only after its own holdings are there.

A worker on a plain `redis://` URL has no Sentinels to ask: a READONLY reply
(its URL now names a replica) drops its connections instead (`runtime.py`).
At start, a worker behind Sentinel says once when the primary runs without
`min-replicas-to-write` (the primary itself then refuses writes it could not
replicate, narrowing what a failover can lose); the fleet's promise holds
without it.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import bootsteps

from contract.broker import kombu_redis
from contract.redis_link.connections import is_sentinel, redact_url
from contract.names import PromptState

from . import deliveries, transport
from ..reporting import lifeline
from ..output import turns
from .deliveries import STARTED
from .recent import ACKED, ADVANCED
from .runtime import Runtime, get_runtime
from .specs import cached_spec

log = logging.getLogger(__name__)


class NewPrimary(redis.ConnectionError):
    """Raised in the consumer's event loop: the Sentinels name a new primary, reconnect there."""


def reassert(app, rt: Runtime) -> dict[str, int]:
    """Write on the primary of now what this worker holds and stored lately; how many of each.
    Conversations first move on from the turns it moved past (their next turns may be missing
    there, and a done mark of a turn the ledger does not have is no mark), then the done marks,
    then conversations move on from the turns those marks made done."""
    held = 0
    for run, prompt_ids in STARTED.noted().items():  # an intake in progress notes its own (confirmed_intake)
        held += sum(deliveries.hold(rt.redis, run, pid, rt.worker) for pid in prompt_ids)
    moved_on = _advance(app, rt, ADVANCED.items())
    groups = rt.shards.book.recent.items() if rt.shards.book else []
    fresh = []
    for run, samples, shard in groups:
        found = rt.shards.book.mark(run, samples, shard)
        fresh += [(run, sample[0]) for sample, state in zip(samples, found)
                  if state in (PromptState.QUEUED, PromptState.DEAD)]
    moved_on += _advance(app, rt, fresh)
    tags = list(dict.fromkeys(ACKED.items()))
    kombu_redis.ack(rt.redis, tags)
    rt.monitor.wake()  # the heartbeat that lists what this worker holds, now
    return {"deliveries noted again": held, "groups marked done again": len(groups),
            "samples found not done": len(fresh), "conversations moved on again": moved_on,
            "acks sent again": len(tags)}


def _advance(app, rt: Runtime, turns_done: list[tuple[str, str]]) -> int:
    """Move conversations past these stored turns where the primary of now has them still at
    them (`turns.advance` does nothing, with one read, where they are past); how many moved."""
    moved = 0
    for run, prompt_id in dict.fromkeys(turns_done):
        try:
            spec = cached_spec(rt.settings.redis_url, run)
            outcome = turns.advance(app, rt, spec, prompt_id) if spec.turns == "all" else None
            if outcome is not None and outcome != "already past this turn" and not outcome.startswith("turn is"):
                moved += 1
        except Exception as exc:  # the audit's sweep moves it on later
            log.warning("turn %s: its conversation could not move on after the failover (%r)", prompt_id, exc)
    return moved


def warn_without_min_replicas(client: redis.Redis, url: str) -> None:
    """One line at start when a Sentinel-managed primary takes writes it cannot replicate."""
    try:
        conf = {}
        for name in ("min-replicas-to-write", "min-replicas-max-lag"):
            conf.update({_text(k): _text(v) for k, v in client.config_get(name).items()})
    except redis.RedisError as exc:
        log.warning("could not read min-replicas-to-write of the primary behind %s (%s): set it to 1 "
                    "(and min-replicas-max-lag) so that an isolated primary refuses writes", redact_url(url), exc)
        return
    if int(conf.get("min-replicas-to-write", "0") or 0) < 1:
        log.warning("the primary behind %s runs without min-replicas-to-write (min-replicas-max-lag %s): "
                    "an old primary takes writes a failover then discards; the fleet writes them again, "
                    "but set min-replicas-to-write 1 and min-replicas-max-lag 10 to narrow the window",
                    redact_url(url), conf.get("min-replicas-max-lag", "?"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class FailoverWatch(bootsteps.StartStopStep):
    """The thread that asks the Sentinels (from the consumer's first start to its shutdown, across
    reconnects), and the consumer timer that reconnects when it asks."""
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._reconnect = threading.Event()
        self._thread: threading.Thread | None = None
        self.tref = None

    def start(self, c) -> None:
        rt = get_runtime(c.app.fleet_settings, c.hostname)
        if not is_sentinel(rt.settings.redis_url):
            return
        if self._thread is None:
            warn_without_min_replicas(rt.redis, rt.settings.redis_url)
            self._thread = threading.Thread(target=lifeline.guarded("failover watch", self._run), args=(c.app, rt),
                                            name="fleet-failover", daemon=True)
            self._thread.start()
        self.tref = c.timer.call_repeatedly(0.25, self._reconnect_if_asked, priority=10)

    def stop(self, c) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def shutdown(self, c) -> None:
        self._stop.set()

    def _reconnect_if_asked(self) -> None:
        if self._reconnect.is_set():
            self._reconnect.clear()
            raise NewPrimary("the Sentinels name a new primary: the consumer reconnects there")

    def _run(self, app, rt: Runtime) -> None:
        pool = rt.redis.connection_pool
        trouble = lifeline.Trouble("asking the Sentinels where the primary is")
        last = None
        while not self._stop.wait(rt.settings.failover_check_interval):
            try:
                now = pool.get_master_address()  # drops this pool's idle connections when it moved
                if last is not None and now != last:
                    self._moved(app, rt, last, now)
                last = now
                trouble.ok()
            except Exception as exc:  # the Sentinels or the new primary not answering yet: next time
                trouble.failed(exc)

    def _moved(self, app, rt: Runtime, old: tuple, new: tuple) -> None:
        log.warning("the Sentinels name a new primary (%s:%s, was %s:%s): moving there", *new, *old)
        for pool in transport.sentinel_pools():
            try:
                pool.get_master_address()
            except redis.RedisError as exc:
                log.debug("a kombu pool could not ask the Sentinels (%r)", exc)
        done = reassert(app, rt)
        log.warning("asserted on the new primary: %s", ", ".join(f"{n} {what}" for what, n in done.items()))
        self._reconnect.set()
