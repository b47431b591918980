"""Leases: a live worker keeps its prompts; a dead worker's come back quickly.

kombu's Redis transport hands an unacknowledged message to another worker once
its score in the `unacked_index` sorted set (the time it was fetched) is older
than `visibility_timeout`. The fleet sets that timeout short (the lease), and
this step re-scores every delivery the worker still holds well before it runs
out, so a generation that runs for an hour is never handed to a second worker,
while a SIGKILLed worker's prompts are restored within one lease.
"""
from __future__ import annotations

import logging
import threading
import time

from celery import bootsteps

from contract import kombu_redis

from .runtime import get_runtime

log = logging.getLogger(__name__)


class LeaseKeeper(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, c) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(c,), name="fleet-lease", daemon=True)
        self._thread.start()

    def stop(self, c) -> None:
        self._stop.set()

    def _run(self, c) -> None:
        rt = get_runtime(c.app.fleet_settings, c.hostname)
        period = max(1.0, rt.settings.lease_seconds / 4)
        while not self._stop.wait(period):
            try:
                renewed = self.renew(c, rt.redis)
            except Exception as exc:  # a broker blip must not kill the thread
                log.warning("lease renewal failed: %r", exc)
                continue
            if renewed:
                log.debug("renewed %d leases", renewed)

    @staticmethod
    def renew(c, client) -> int:
        consumer = c.task_consumer
        if consumer is None:
            return 0
        channel = consumer.channel
        held = kombu_redis.held_tags(channel)
        if not held:
            return 0
        now = time.time()
        client.zadd(kombu_redis.index_key(channel), {tag: now for tag in held}, xx=True)
        return len(held)
