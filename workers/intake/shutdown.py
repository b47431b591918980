"""SIGTERM drains within a grace period, keeps what is finished, then hands back the rest.

Celery's warm shutdown (SIGTERM) stops fetching and waits for running tasks,
however long they take; Kubernetes SIGKILLs the pod when its grace period is
over, and the prompts would then wait a whole lease to be restored. So once
`FLEET_SHUTDOWN_GRACE` seconds have passed, the worker:

1. commits what the shard writer holds, even when its group commit would wait
   longer (`FLEET_SHARD_MAX_WAIT` above the grace): every sample finished
   before the end of the grace becomes durable;
2. waits, at most `SETTLE_SECONDS`, for the tasks of those samples to mark
   them done (`tasks.committing()` counts them);
3. settles every delivery it still holds, the current channel's and those kept
   across a reconnect, by the ledger: a prompt done or dead is acknowledged,
   never handed back, so never generated again (even if its task's own ack is
   still queued on the stopped event loop); any other goes back to the queue
   exactly once (kombu's restore, through the live channel, or else an expired
   lease that any worker's sweep restores; always the latter for a worker that
   can no longer work, `workers/reporting/lifeline.py`, whose consumer may still be polling the
   queue), and that delivery is not counted
   against the prompt (`deliveries.undo`): a rolling restart poisons nothing;
4. exits 0 (`lifeline.EXIT_BROKEN` for a worker that can no longer work).

Every wait has a deadline: the grace itself, the writer's join, the settle
wait, and a watchdog that exits with status 1 when the hand-back hangs on
Redis for `HAND_BACK_SECONDS`; whatever it could not hand back returns when
its lease runs out. A worker whose tasks all end within the grace shuts down
the ordinary way and settles, the same way, what a reconnect left it holding.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from celery import bootsteps, signals

from contract.broker import kombu_redis

from . import deliveries
from ..reporting import lifeline
from .consumer import current_channel, held_deliveries
from .lease import finished, settle
from .runtime import get_runtime
from .tasks import HANDING_BACK, committing

log = logging.getLogger(__name__)
SETTLE_SECONDS = 10.0     # for tasks whose samples were just committed to mark them done
HAND_BACK_SECONDS = 25.0  # the whole hand-back, after the grace (keep the pod's grace above both)
_consumer: list = []  # [(consumer, runtime)] once consuming
_settled = [0, 0]  # finished prompts acknowledged, and prompts handed back, at shutdown (`farewell`)


class ShutdownGrace(bootsteps.StartStopStep):
    """Remembers the consumer, whose deliveries are settled when the grace is over."""
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c) -> None:
        _consumer[:] = [(c, get_runtime(c.app.fleet_settings, c.hostname))]

    def shutdown(self, c) -> None:
        """Tasks are over (or cancelled before they ran): settle what is still held, within
        `HAND_BACK_SECONDS` (a Redis that is down must not hold the exit)."""
        if _consumer:
            worker = threading.Thread(target=self._settle, name="fleet-settle", daemon=True)
            worker.start()
            worker.join(HAND_BACK_SECONDS)

    @staticmethod
    def _settle() -> None:
        try:
            _settled[:] = settle_held(*_consumer[0])
        except Exception:
            log.exception("settling held prompts at shutdown failed: their leases will run out")


@signals.worker_shutting_down.connect
def _arm_grace_timer(sig=None, how=None, exitcode=None, **_) -> None:
    if not _consumer:  # stopped before consuming: nothing is held
        return
    if lifeline.broken():  # what it holds it cannot finish: hand it back now
        grace = 0.0
    else:
        grace = _consumer[0][0].app.fleet_settings.shutdown_grace
        log.info("%s received: finishing in-flight prompts for up to %.0fs (FLEET_SHUTDOWN_GRACE), then "
                 "handing the rest back to the queue", sig, grace)
    timer = threading.Timer(grace, _hand_back)
    timer.daemon = True
    timer.start()


def _hand_back() -> None:
    watchdog = threading.Timer(HAND_BACK_SECONDS, _give_up)
    watchdog.daemon = True
    watchdog.start()
    HANDING_BACK.set()
    c, rt = _consumer[0]
    try:
        rt.shards.close()  # finished samples: into a shard
    except Exception:
        log.exception("flushing shards at the end of the grace period failed")
    _wait(lambda: committing() == 0, SETTLE_SECONDS)
    try:
        kept, back = settle_held(c, rt)
        log.info("worker stopped at the end of its grace period: samples in shards, %d finished prompts "
                 "acknowledged, %d in-flight prompts handed back to the queue", kept, back)
    except Exception:
        log.exception("handing prompts back failed: they return when their leases run out")
    logging.shutdown()
    os._exit(lifeline.EXIT_BROKEN if lifeline.broken() else 0)


def farewell() -> str:
    """The worker log's last line after an ordinary shutdown: what it handed back."""
    kept, back = _settled
    return (f"worker stopped cleanly: samples in shards, {kept} finished prompts acknowledged and {back} "
            f"handed back to the queue at shutdown")


def settle_held(c, rt) -> tuple[int, int]:
    """Acknowledge every held delivery whose prompt is finished; hand back the others.
    Returns (acknowledged, handed back)."""
    held = held_deliveries(c)
    done = finished(rt.redis, held.values())
    settle(rt.redis, held, done)
    back = [d for tag, d in held.items() if tag not in done]
    if lifeline.broken():  # its consumer may still be polling the queue: never feed it what it hands back
        kombu_redis.expire(rt.redis, [d.tag for d in back])
    else:
        _restore(c, rt, back)
    for d in back:
        kombu_redis.mark_acked(d.qos, d.tag)
        if d.run is not None and d.prompt_id is not None:
            deliveries.STARTED.take_back(rt.redis, d.run, d.prompt_id, rt.worker)
    return len(done), len(back)


def _restore(c, rt, back: list) -> None:
    """Back on the queue now, through the live channel; else through any worker's restore sweep."""
    channel = current_channel(c)
    try:
        if channel is None:
            raise ConnectionError("no live broker channel")
        kombu_redis.restore(channel, [d.tag for d in back])
    except Exception as exc:
        log.warning("restoring through the broker channel failed (%r): expiring the leases instead", exc)
        kombu_redis.expire(rt.redis, [d.tag for d in back])


def _wait(predicate, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


def _give_up() -> None:
    log.error("handing prompts back took over %.0fs: exiting; the rest return when their leases run out",
              HAND_BACK_SECONDS)
    logging.shutdown()
    os._exit(1)
