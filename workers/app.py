"""The Celery app: `celery -A workers worker` starts a worker with no other flag.

JSON only on the broker (never pickle), late acknowledgement after the sample
is durable, prefetch of one per thread, and a threads pool large enough to keep
many requests in flight per SGLang server.
"""
from __future__ import annotations

import logging
import ssl

from celery import Celery, signals

from .audit import LostMessageAudit
from .gate import HealthGate
from .lease import LeaseKeeper
from .runtime import close_runtime
from .settings import get_settings
from .shutdown import ShutdownGrace

settings = get_settings()
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise

app = Celery("workers", broker=settings.redis_url, include=["workers.tasks"])
if settings.redis_url.startswith("rediss://") and "ssl_cert_reqs" not in settings.redis_url:
    # kombu would otherwise fall back to TLS without certificate checks.
    app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    event_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_pool="threads",
    worker_concurrency=settings.pool_size,
    task_default_queue=settings.queue_prefix,
    task_create_missing_queues=True,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    broker_transport_options={
        "visibility_timeout": settings.lease_seconds,
        "unacked_restore_interval": settings.restore_interval,
        "unacked_restore_throttle": 1,
        # A worker killed during a restore sweep leaves the sweep's lock behind;
        # kombu's 5 minutes would stall every restore for that long.
        "unacked_mutex_expire": max(10, int(settings.lease_seconds / 2)),
        # Bodies are JSON text already; kombu's default base64 would add a third
        # to every queued message.
        "body_encoding": "utf-8",
    },
    worker_send_task_events=True,
    task_send_sent_event=True,
    worker_hijack_root_logger=False,
    worker_consumer="workers.consumer:FleetConsumer",
)
app.steps["consumer"].add(HealthGate)
app.steps["consumer"].add(LeaseKeeper)
app.steps["consumer"].add(ShutdownGrace)
app.steps["consumer"].add(LostMessageAudit)


@signals.worker_shutdown.connect
def _flush_on_shutdown(**_) -> None:
    close_runtime()
