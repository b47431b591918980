"""The broker settings both sides must agree on, and a Celery app to publish with.

The producer and the workers are separate Celery apps on one Redis: they must
agree on the serializer (JSON only: pickle is never accepted), on how kombu
stores a body (UTF-8 text, not base64, which would add a third to every
queued message) and on sending `task-sent` events (Flower lists queued
prompts from them). Celery is imported when an app is built, not before.
"""
from __future__ import annotations

import ssl

from .keys import DEFAULT_QUEUE

SERIALIZATION = dict(
    task_serializer="json",
    result_serializer="json",
    event_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    task_ignore_result=True,
    task_send_sent_event=True,
    task_create_missing_queues=True,
)
TRANSPORT = {"body_encoding": "utf-8"}


def ssl_options(redis_url: str) -> dict | None:
    """kombu would fall back to TLS without certificate checks for a bare `rediss://`."""
    if redis_url.startswith("rediss://") and "ssl_cert_reqs" not in redis_url:
        return {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return None


def celery_app(redis_url: str, name: str = "fleet-producer", queue: str = DEFAULT_QUEUE,
               transport: dict | None = None, **conf):
    """A Celery app on `redis_url` with the fleet's shared settings (and `conf` on top)."""
    from celery import Celery

    app = Celery(name, broker=redis_url, set_as_current=False)
    use_ssl = ssl_options(redis_url)
    if use_ssl:
        app.conf.broker_use_ssl = use_ssl
    app.conf.update(**SERIALIZATION, task_default_queue=queue,
                    broker_transport_options={**TRANSPORT, **(transport or {})},
                    broker_connection_retry_on_startup=True,
                    broker_channel_error_retry=True,  # a refused write (OOM, READONLY) restarts the consumer
                    **conf)
    return app
