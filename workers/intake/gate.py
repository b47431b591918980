"""Consume only with somewhere to send, and somewhere to store.

A consumer bootstep that reconciles, four times a second, the queues this worker
takes prompts from with the state of its servers and of its output storage:
none while every bound server is down, the shard writer's last write failed
or Redis refuses writes (`workers/intake/redis_writes.py`) (the prompts stay safely
in Redis for other workers; the samples already made wait in the writer),
the general queue plus one queue per model its healthy
servers serve otherwise.
Reconciling on a timer, rather than reacting to one event, also repairs the
consumer Celery re-creates after a broker reconnect.

The same timer sets how many prompts the worker holds (its prefetch count),
following the servers' tuned capacity (`workers/servers/capacity.py`): the requests it
means to keep in flight, a quarter more waiting for a slot, plus the samples
waiting for their shard's group commit (they hold a prompt but no server
slot), never more than the worker's threads. So a worker takes from the
queue what its servers can run, not a fixed guess, and leaves the rest to
other workers.
"""
from __future__ import annotations

import logging

from celery import bootsteps

from contract.keys import queue_for

from ..reporting import lifeline
from .runtime import get_runtime
from .tasks import committing

log = logging.getLogger(__name__)


class HealthGate(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self.tref = None
        self.consumed = False  # whether this worker has consumed yet

    def start(self, c) -> None:
        self.runtime = get_runtime(c.app.fleet_settings, c.hostname)
        self.reconcile(c)  # before the event loop fetches anything
        # A set comparison, no I/O: cheap enough to run often, which narrows the window
        # between a health check marking the last server down and consuming stopping.
        self.tref = c.timer.call_repeatedly(0.25, self.reconcile, (c,), priority=10)

    def stop(self, c) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def closed_because(self) -> str | None:
        """Why nothing should be consumed now, or None."""
        if lifeline.broken():
            return f"this worker cannot work on ({lifeline.broken()})"
        refused = self.runtime.writes.refused
        if refused is not None:
            return f"Redis refuses writes ({refused.cause})"
        if not self.runtime.shards.storage.up:
            return f"storage failing ({self.runtime.shards.storage.last_error})"
        if not self.runtime.pool.any_usable():
            return "no healthy server"
        return None

    def desired_queues(self, closed_because: str | None) -> set[str]:
        pool, prefix = self.runtime.pool, self.runtime.settings.queue_prefix
        if closed_because:
            return set()
        return {prefix} | {queue_for(prefix, model) for model in pool.healthy_models()}

    def prefetch(self) -> int:
        """Prompts to hold: tuned in-flight targets, a quarter more, and those waiting for a shard."""
        targets = self.runtime.pool.targets()
        return max(1, min(targets + max(targets // 4, 4) + committing(), self.runtime.settings.pool_size))

    def reconcile(self, c) -> None:
        if c.task_consumer is None:
            return
        qos = getattr(c, "qos", None)
        if qos is not None:
            wanted = self.prefetch()
            if qos.value != wanted:
                qos.value = wanted
                qos.update()
        why = self.closed_because()
        desired = self.desired_queues(why)
        current = {q.name for q in c.task_consumer.queues}
        for name in sorted(desired - current):
            c.add_task_queue(name)
        for name in sorted(current - desired):
            c.cancel_task_queue(name)
        if desired != current:
            self._say(desired, why)

    def _say(self, desired: set[str], why: str | None) -> None:
        """One line per change: queues taken at INFO; stopping is a WARNING, except before the
        worker ever consumed (its servers are still being checked at start-up)."""
        if desired:
            self.consumed = True
            log.info("consuming from %s", ", ".join(sorted(desired)))
        elif self.consumed:
            log.warning("consuming from nothing: %s (prompts stay queued in Redis, for other workers or until "
                        "this one can take them again)", why)
        else:
            log.info("waiting to consume: %s yet (prompts stay queued in Redis)", why)
