"""SIGTERM drains within a grace period, then hands back what is left.

Celery's warm shutdown (SIGTERM) stops fetching and waits for running tasks,
however long they take; Kubernetes SIGKILLs the pod when its grace period is
over, and the prompts would then wait a whole lease to be restored. So once
`FLEET_SHUTDOWN_GRACE` seconds have passed, the worker flushes its shards
(finished samples become durable), puts every prompt it still holds back on
the queue for other workers, and exits 0.
"""
from __future__ import annotations

import logging
import os
import threading

from celery import bootsteps, signals

from contract import kombu_redis

from .runtime import close_runtime

log = logging.getLogger(__name__)
_consumer: list = []


class ShutdownGrace(bootsteps.StartStopStep):
    """Remembers the consumer, whose deliveries are handed back when the grace is over."""
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c) -> None:
        _consumer[:] = [c]


@signals.worker_shutting_down.connect
def _arm_grace_timer(sig=None, how=None, exitcode=None, **_) -> None:
    if not _consumer:  # stopped before consuming: nothing is held
        return
    grace = _consumer[0].app.fleet_settings.shutdown_grace
    log.warning("%s received: draining in-flight prompts for up to %.0fs", sig, grace)
    timer = threading.Timer(grace, _hand_back)
    timer.daemon = True
    timer.start()


def _hand_back() -> None:
    try:
        close_runtime()  # finished samples: into a shard, and marked done
    except Exception:
        log.exception("flushing shards at the end of the grace period failed")
    if _consumer and _consumer[0].task_consumer is not None:
        channel = _consumer[0].task_consumer.channel
        log.warning("grace period over: handing %d in-flight prompts back to the queue",
                    kombu_redis.held_count(channel))
        kombu_redis.restore_held(channel)
    logging.shutdown()
    os._exit(0)
