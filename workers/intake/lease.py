"""Leases: a live worker keeps its prompts; a dead worker's come back quickly; none is held forever.

kombu's Redis transport hands an unacknowledged message to another worker once
its score in the `unacked_index` sorted set is from 0 up to `visibility_timeout`
ago. The fleet sets that timeout short (the lease) and holds every delivery a
worker takes under one lease of the worker's own (`contract/broker/worker_lease.py`:
the delivery is scored with the worker's lease holder, below 0, outside kombu's
sweep), which this step renews well before it runs out, so a generation that
runs for an hour is never handed to a second worker, while a SIGKILLed
worker's prompts are handed back by the next live worker's round once its
lease has run out, and restored by kombu's sweep.

"Every delivery the worker holds" includes those of channels closed under
running tasks by a lost broker connection (`consumer.Detached`): their tasks
still run here, so they stay under the same lease. The keeper's thread therefore
lives from the consumer's first start to its shutdown, across reconnects, and
renews on a Redis connection of its own (`redis_pool.lease_redis`): task threads
waiting on a replica during a failover hold the shared ones long enough to let
a lease lapse.

Rounds come every quarter lease (`round_period`), so a live worker's lease
lapses only after three quarters of a lease (90 s at the default 120 s)
without a round (a broker outage, a stalled process, a partition). A round's
Redis work does not grow with what the worker holds: one script renews the
lease and hands a page of lapsed holders' deliveries to the sweep, and at most
`CHECKS_PER_ROUND` prompts' states are read. (`Leases(by_holder=False)`, a
delivery scored by time as kombu's own take does, re-scores each one a round.)

Two things end a lease that would otherwise be renewed forever:
- a delivery whose prompt the ledger records as done or dead at two checks in
  a row is acknowledged here: its task finished but its ack was lost (the
  connection dropped under it). A delivery is checked only when its prompt is
  not being generated here (`STARTED.holds`): a task still running settles its
  own delivery when it ends, so only one whose task ended (or never began) can
  be finished without its ack. Such deliveries are checked a slice a round, in
  turn, so a round's reads stay bounded;
- a delivery held longer than `hold_limit` (every request the task may make at
  its full timeout, and more) is handed back (its lease expired alone, for
  kombu's sweep to restore): its task is stuck, so the prompt goes to another
  worker, and its delivery count (`deliveries`) records the lost delivery; the
  worker stops listing the prompt among those it holds (`STARTED.let_go`), so
  the next worker starts it.

A worker whose lease was found lapsed while it lived (it froze past the lease)
takes back, at its next round, those of its deliveries the sweep has not
restored yet (`worker_lease.reclaim`).

Scores are times on Redis's clock (`contract/redis_link/clock.py`), as the worker
transport's are (its scripts read `TIME`): each round first measures it again, so a worker
whose own clock is off renews a lease that every other worker reads as fresh.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from celery import bootsteps

from contract.broker import kombu_redis, worker_lease
from contract.redis_link.clock import CLOCK
from contract.ledger.ledger import Ledger
from contract.names import PromptState
from contract.counts import counted

from ..reporting import lifeline
from .consumer import Delivery, held_deliveries
from .deliveries import STARTED
from .redis_pool import lease_redis
from .runtime import get_runtime
from ..settings import Settings

log = logging.getLogger(__name__)
FINISHED = (PromptState.DONE, PromptState.DEAD)
CHECKS_PER_ROUND = 64  # held deliveries not running here whose prompt's state one round reads


def hold_limit(s: Settings) -> float:
    """The longest a live worker keeps one delivery leased: each request at its full timeout and
    longest backoff (one more for a resample), every connection failure allowed, a wait for a
    server, a wait for an earlier request for the prompt still running on its server (one request's
    timeout: `request_loop._waited_for_earlier`), the group commit, and one lease of slack."""
    per_request = s.connect_timeout + s.request_timeout + s.retry_backoff_max
    unavailable = s.max_unavailable * (s.connect_timeout + 5.0)
    earlier = s.request_timeout
    return ((s.max_attempts + 1) * per_request + unavailable + earlier + s.server_wait + s.shard_max_wait
            + s.lease_seconds)


def finished(client, held: Iterable[Delivery]) -> set[str]:
    """Tags of the deliveries whose prompt the ledger records as done or dead."""
    by_run: dict[str, list[Delivery]] = {}
    for d in held:
        if d.run is not None and d.prompt_id is not None:
            by_run.setdefault(d.run, []).append(d)
    tags = set()
    for run, group in by_run.items():
        states = Ledger(client, run).states([d.prompt_id for d in group])
        tags |= {d.tag for d, state in zip(group, states) if state in FINISHED}
    return tags


def settle(client, held: dict[str, Delivery], tags: Iterable[str]) -> None:
    """Acknowledge deliveries by tag, and tell the QoS holding each one."""
    tags = [t for t in tags if t in held]
    kombu_redis.ack(client, tags)
    for tag in tags:
        kombu_redis.mark_acked(held[tag].qos, tag)


def round_period(lease_seconds: float) -> float:
    """Seconds between two lease rounds: a quarter lease (at least one second), so that a lease
    lapses only after three quarters of a lease without a round."""
    return max(1.0, lease_seconds / 4)


class Leases:
    """One round at a time: renew the lease, settle what is finished, hand back what is overdue.
    `decide` is the whole policy, without I/O; `round` reads the ledger and writes the lease.
    `by_holder`: deliveries are held under the worker's lease (`worker_lease`); False where
    kombu's own take scored each by time, so each is renewed."""

    def __init__(self, client, limit: float, lease_seconds: float, clock: Callable[[], float] = time.monotonic,
                 running: Callable[[Delivery], bool] = lambda d: STARTED.holds(d.run, d.prompt_id),
                 holder: worker_lease.Holder | None = None, by_holder: bool = True):
        self.client, self.limit, self.lease_seconds = client, limit, lease_seconds
        self.clock, self.running, self._holder, self.by_holder = clock, running, holder, by_holder
        self._since: dict[str, float] = {}
        self._finished: set[str] = set()
        self._overdue: set[str] = set()
        self._cursor = ""  # the last tag whose state a round read: the next goes on after it

    @property
    def holder(self) -> worker_lease.Holder:
        return self._holder or worker_lease.HOLDER

    def decide(self, held: Iterable[str], checked: Iterable[str],
               finished_now: set[str]) -> tuple[set[str], list[str], set[str]]:
        """(tags to settle, tags to keep, tags newly overdue) for this round, given the tags whose
        prompt's state was read (`checked`) and those of them whose prompt is finished now. A tag is
        settled when its prompt was finished at this check and its previous one; it is overdue once
        held longer than the limit, and then never kept again; every other held tag is kept."""
        now = self.clock()
        held = list(held)
        self._since = {tag: self._since.get(tag, now) for tag in held}
        settled = finished_now & self._finished
        self._finished = ((self._finished - set(checked)) | finished_now) & set(held)
        overdue = {tag for tag, since in self._since.items() if now - since > self.limit}
        newly, self._overdue = overdue - self._overdue, overdue
        return settled, [t for t in held if t not in settled and t not in overdue], newly

    def to_check(self, idle: Iterable[Delivery]) -> list[Delivery]:
        """At most `CHECKS_PER_ROUND` of the deliveries not running here, in tag order, going on
        after the last round's, so each is read in turn."""
        idle = sorted(idle, key=lambda d: d.tag)
        after = [d for d in idle if d.tag > self._cursor]
        chosen = (after + [d for d in idle if d.tag <= self._cursor])[:CHECKS_PER_ROUND]
        self._cursor = chosen[-1].tag if chosen else ""
        return chosen

    def round(self, held: dict[str, Delivery]) -> int:
        at = CLOCK.sync(self.client)
        checked = self.to_check(d for d in held.values() if not self.running(d))
        settled, kept, newly_overdue = self.decide(held, [d.tag for d in checked], finished(self.client, checked))
        settle(self.client, held, settled)
        for tag in sorted(newly_overdue):
            log.warning("prompt %s of run %s held for over %.0fs: handed back to its queue",
                        held[tag].prompt_id, held[tag].run, self.limit)
            STARTED.let_go(held[tag].run, held[tag].prompt_id)
        kombu_redis.expire(self.client, newly_overdue)
        if not self.by_holder:  # kombu's own take: a lease per delivery
            kombu_redis.renew(self.client, kept, at)
            return len(kept)
        found = worker_lease.renew(self.client, self.holder, at, self.lease_seconds)
        if found.missing and kept:
            back = worker_lease.reclaim(self.client, self.holder, at, kept)
            log.warning("this worker's lease had run out (a stall, or a failover): %d of the %s it "
                        "holds taken back, the others went back to their queue", back, counted(len(kept), "prompt"))
        if found.reaped:
            log.info("%s of workers whose lease ran out handed back to their queues", counted(found.reaped, "prompt"))
        return len(kept)


def keeper_leases(s: Settings) -> Leases:
    """The keeper's rounds, on its own Redis connection (`redis_pool.lease_redis`)."""
    return Leases(lease_redis(s.redis_url), hold_limit(s), s.lease_seconds)


class LeaseKeeper(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, c) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # a reconnect: the thread never stopped
        self._stop.clear()
        self._thread = threading.Thread(target=lifeline.guarded("lease keeper", self._run), args=(c,),
                                        name="fleet-lease", daemon=True)
        self._thread.start()

    def stop(self, c) -> None:
        """A reconnect stops the consumer's steps too: detached deliveries still need renewing."""

    def shutdown(self, c) -> None:
        self._stop.set()

    def _run(self, c) -> None:
        rt = get_runtime(c.app.fleet_settings, c.hostname)
        leases = keeper_leases(rt.settings)
        period = round_period(rt.settings.lease_seconds)
        trouble = lifeline.Trouble("lease renewal")
        while True:
            try:
                renewed = leases.round(held_deliveries(c))
                trouble.ok()
                if renewed:
                    log.debug("renewed %d leases", renewed)
            except Exception as exc:  # a broker blip must not kill the thread
                trouble.failed(exc)
            if self._stop.wait(period):
                return
