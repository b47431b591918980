"""Leases: a live worker keeps its prompts; a dead worker's come back quickly; none is held forever.

kombu's Redis transport hands an unacknowledged message to another worker once
its score in the `unacked_index` sorted set (the time it was fetched) is older
than `visibility_timeout`. The fleet sets that timeout short (the lease), and
this step re-scores every delivery the worker still holds well before it runs
out, so a generation that runs for an hour is never handed to a second worker,
while a SIGKILLed worker's prompts are restored within one lease.

"Every delivery the worker holds" includes those of channels closed under
running tasks by a lost broker connection (`consumer.Detached`): their tasks
still run here, so their leases must not lapse. The keeper's thread therefore
lives from the consumer's first start to its shutdown, across reconnects, and
renews through the worker's own Redis client.

Rounds come every quarter lease (`round_period`) and renew every held
delivery, so after a round no lease the worker holds is older than that round,
and before the next none is more than a quarter lease old: a live worker's
leases lapse only after three quarters of a lease (90 s at the default 120 s)
without a round (a broker outage, a stalled process, a partition). Renewing
only the leases nearly due would save a few us of Redis per worker-second and
cost that tolerance, so every round renews them all, in one ZADD XX.

Two things end a lease that would otherwise be renewed forever:
- a delivery whose prompt the ledger records as done or dead at two checks in
  a row is acknowledged here: its task finished but its ack was lost (the
  connection dropped under it). A delivery is checked only when its prompt is
  not being generated here (`STARTED.holds`): a task still running settles its
  own delivery when it ends, so only one whose task ended (or never began) can
  be finished without its ack. Reading every held prompt's state was the larger
  part of a round's Redis work (`python -m bench --parts fleet`);
- a delivery held longer than `hold_limit` (every request the task may make at
  its full timeout, and more) is no longer renewed: its task is stuck, so the
  lease runs out, the prompt goes to another worker, and its delivery count
  (`deliveries`) records the lost delivery; the worker stops listing the prompt
  among those it holds (`STARTED.let_go`), so the next worker starts it.

Scores are times on Redis's clock (`contract/clock.py`), as kombu's own are
(`kombu_redis.use_clock`): each round first measures it again, so a worker
whose own clock is off renews leases that every other worker reads as fresh.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from celery import bootsteps

from contract import kombu_redis
from contract.clock import CLOCK
from contract.ledger import Ledger
from contract.names import PromptState

from ..reporting import lifeline
from .consumer import Delivery, held_deliveries
from .deliveries import STARTED
from .runtime import get_runtime
from ..settings import Settings

log = logging.getLogger(__name__)
FINISHED = (PromptState.DONE, PromptState.DEAD)


def hold_limit(s: Settings) -> float:
    """The longest a live worker keeps one delivery leased: each request at its full timeout and
    longest backoff (one more for a resample), every connection failure allowed, a wait for a
    server, the group commit, and one lease of slack."""
    per_request = s.connect_timeout + s.request_timeout + s.retry_backoff_max
    unavailable = s.max_unavailable * (s.connect_timeout + 5.0)
    return (s.max_attempts + 1) * per_request + unavailable + s.server_wait + s.shard_max_wait + s.lease_seconds


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
    """One round at a time: renew what is held, settle what is finished, drop what is overdue.
    `decide` is the whole policy, without I/O; `round` reads the ledger and writes the leases."""

    def __init__(self, client, limit: float, clock: Callable[[], float] = time.monotonic,
                 running: Callable[[Delivery], bool] = lambda d: STARTED.holds(d.run, d.prompt_id)):
        self.client, self.limit, self.clock, self.running = client, limit, clock, running
        self._since: dict[str, float] = {}
        self._finished: set[str] = set()
        self._overdue: set[str] = set()

    def decide(self, held: Iterable[str], checked: Iterable[str],
               finished_now: set[str]) -> tuple[set[str], list[str], set[str]]:
        """(tags to settle, tags to renew, tags newly overdue) for this round, given the tags whose
        prompt's state was read (`checked`) and those of them whose prompt is finished now. A tag is
        settled when its prompt was finished at this check and its previous one; it is overdue once
        held longer than the limit, and then never renewed again; every other held tag is renewed."""
        now = self.clock()
        held = list(held)
        self._since = {tag: self._since.get(tag, now) for tag in held}
        settled = finished_now & self._finished
        self._finished = ((self._finished - set(checked)) | finished_now) & set(held)
        overdue = {tag for tag, since in self._since.items() if now - since > self.limit}
        newly, self._overdue = overdue - self._overdue, overdue
        return settled, [t for t in held if t not in settled and t not in overdue], newly

    def round(self, held: dict[str, Delivery]) -> int:
        at = CLOCK.sync(self.client)
        checked = [d for d in held.values() if not self.running(d)]
        settled, live, newly_overdue = self.decide(held, [d.tag for d in checked], finished(self.client, checked))
        settle(self.client, held, settled)
        for tag in sorted(newly_overdue):
            log.warning("prompt %s of run %s held for over %.0fs: its lease is left to run out",
                        held[tag].prompt_id, held[tag].run, self.limit)
            STARTED.let_go(held[tag].run, held[tag].prompt_id)
        if live:
            kombu_redis.renew(self.client, live, at)
        return len(live)


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
        leases, period = Leases(rt.redis, hold_limit(rt.settings)), round_period(rt.settings.lease_seconds)
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
