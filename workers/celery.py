"""The Celery app: `celery -A workers worker` finds it here (Celery looks up `workers.celery`).

This is the worker's entry point, so it is the one place that reads the
settings (once) and builds the app; everything else gets them passed in
(`app.fleet_settings`). JSON only on the broker (never pickle), late
acknowledgement after the sample is durable, a threads pool large enough to
keep many requests in flight per SGLang server, and as many prompts held as
its servers can run (the health gate sets the prefetch count, `workers/intake/gate.py`).
"""
from __future__ import annotations

import logging
import os
import signal

# First of all: the libraries whose internals the worker stands on are the versions constraints.txt
# pins, or it does not start (before anything of theirs is imported: another version may not import).
from contract.broker.versions import refusal as _version_refusal

if (_wrong_versions := _version_refusal()) is not None:
    raise SystemExit(_wrong_versions)

from celery import signals  # noqa: E402
from pydantic import ValidationError

from contract.broker import kombu_redis
from contract.broker.config import broker_url, celery_app
from contract.settings import settings_refusal

from .reporting import flower_guard  # noqa: F401  (Flower refuses to listen beyond localhost without auth)
from .output import storage_guard  # noqa: F401  (a worker refuses to start when OUTPUT_DIR takes no writes)
from .reporting import lifeline, log_lines
from .intake.audit import LostMessageAudit
from .reporting.events import BatchedEvents
from .intake.failover import FailoverWatch
from .intake.gate import HealthGate
from .intake import heap
from .intake.lease import LeaseKeeper
from .intake import transport
from .intake.redis_pool import configure as configure_redis
from .intake.runtime import close_runtime
from .settings import Settings
from .intake.shutdown import ShutdownGrace, farewell

try:
    settings = Settings()
except ValidationError as _refused:  # OUTPUT_DIR=gs://... and the like: the worker does not start
    raise SystemExit(f"worker refused to start: {settings_refusal(_refused)}") from None
# Every short Redis call shares a few connections, kombu's too: the worker's transport hands them out.
configure_redis(settings.redis_connections, settings.redis_url)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
if not settings.task_log:  # FLEET_TASK_LOG: Celery checks these levels once, when it builds its tracer
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
# Its "Started consuming from"/"Canceling queue" lines repeat the health gate's one line per change.
logging.getLogger("celery.worker.consumer.consumer").setLevel(logging.WARNING)
log_lines.install()  # a prompt handed back: Celery's one line, without its traceback

# kombu's Redis transport, extended by subclassing (workers/intake/transport.py): the batched take,
# the shared client, lease scores on Redis's clock, detaching on a lost connection, acks confirmed
# after a failover, subscriptions heard again. Selected here, so no other process's kombu changes.
_TRANSPORT_OPTIONS = {
    "visibility_timeout": settings.lease_seconds,
    "unacked_restore_interval": settings.restore_interval,
    "unacked_restore_throttle": 1,
    # A worker killed during a restore sweep leaves the sweep's lock behind;
    # kombu's 5 minutes would stall every restore for that long.
    "unacked_mutex_expire": max(10, int(settings.lease_seconds / 2)),
    # kombu's sweep reads every lapsed lease at once by default: after a mass death, one reply of
    # hundreds of thousands. A page a sweep (one every restore interval, by some worker).
    "unacked_restore_limit": kombu_redis.RESTORE_PAGE,
}
if (_unshared := transport.refusal(broker_url(settings.redis_url)[0], _TRANSPORT_OPTIONS)) is not None:
    raise SystemExit(_unshared)
app = celery_app(
    settings.redis_url, name="workers", queue=settings.queue_prefix,
    transport=_TRANSPORT_OPTIONS,
    broker_transport=transport.transport_for(settings.redis_url),
    broker_failover_strategy=transport.keep_transport,
    include=["workers.intake.tasks"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=True,  # a dead-lettered prompt fails its task: acknowledged, never redelivered
    # No result backend (the task ignores its result): Celery's stand-in for none is stateless, so one
    # serves every thread (else each of the hundreds of task threads builds its own on its first task).
    result_backend_thread_safe=True,
    worker_prefetch_multiplier=1,  # until the health gate sets the count, before the first fetch
    worker_pool="threads",
    worker_concurrency=settings.pool_size,
    broker_connection_max_retries=None,
    # Tasks keep running across a lost broker connection; their deliveries stay leased to this
    # worker (workers/intake/consumer.py). Celery 6 means to cancel them by default: never here.
    worker_cancel_long_running_tasks_on_connection_loss=False,
    worker_send_task_events=settings.task_events,  # FLEET_TASK_EVENTS: Flower's task pages need them
    worker_hijack_root_logger=False,
    worker_consumer="workers.intake.consumer:FleetConsumer",
)
app.set_current()
app.fleet_settings = settings
for step in (HealthGate, LeaseKeeper, ShutdownGrace, LostMessageAudit, BatchedEvents, FailoverWatch):
    app.steps["consumer"].add(step)


lifeline.install_test_fault()
lifeline.on_fatal(lambda: os.kill(os.getpid(), signal.SIGTERM))  # Celery's warm shutdown, then `workers/intake/shutdown.py`


@signals.worker_ready.connect
def _settle_heap(**_) -> None:
    heap.settle()  # what the started worker holds is never scanned again (workers/intake/heap.py)


@signals.worker_shutdown.connect
def _flush_on_shutdown(**_) -> None:
    close_runtime()
    if lifeline.broken():  # shut down before the hand-back's own exit: still not a clean exit
        logging.shutdown()
        os._exit(lifeline.EXIT_BROKEN)
    logging.getLogger(__name__).info("%s", farewell())
