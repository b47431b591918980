"""The broker settings both sides must agree on, and a Celery app to publish with.

The producer and the workers are separate Celery apps on one Redis: they must
agree on the serializer (JSON only: pickle is never accepted), on how kombu
stores a body (UTF-8 text, not base64, which would add a third to every
queued message) and on sending `task-sent` events (Flower lists queued
prompts from them). Celery is imported when an app is built, not before.
"""
from __future__ import annotations

import ssl

from contract.redis_link.connections import SENTINEL_SOCKET, SOCKET, is_sentinel, kombu_sentinel_url, sentinel_master
from contract.keys import DEFAULT_QUEUE

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
# The broker's connections get the same deadlines as the fleet's own clients (connections.SOCKET):
# a frozen Redis ends a call with a timeout, and the consumer reconnects, instead of waiting forever.
BROKER_SOCKET = {"socket_timeout": SOCKET["socket_timeout"],
                 "socket_connect_timeout": SOCKET["socket_connect_timeout"],
                 "socket_keepalive": True, "retry_on_timeout": True}


def ssl_options(redis_url: str) -> dict | None:
    """kombu would fall back to TLS without certificate checks for a bare `rediss://`."""
    if redis_url.startswith("rediss://") and "ssl_cert_reqs" not in redis_url:
        return {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return None


def broker_url(redis_url: str) -> tuple[str, dict]:
    """The URL kombu gets, and the transport options that go with it: behind Sentinel, the
    master's name (`FLEET_SENTINEL_MASTER`) and deadlines for the Sentinels' own answers."""
    if not is_sentinel(redis_url):
        return redis_url, dict(BROKER_SOCKET)
    return kombu_sentinel_url(redis_url), {**BROKER_SOCKET, "master_name": sentinel_master(),
                                           "sentinel_kwargs": dict(SENTINEL_SOCKET)}


def celery_app(redis_url: str, name: str = "fleet-producer", queue: str = DEFAULT_QUEUE,
               transport: dict | None = None, **conf):
    """A Celery app on `redis_url` with the fleet's shared settings (and `conf` on top)."""
    from celery import Celery

    url, connection = broker_url(redis_url)
    app = Celery(name, broker=url, set_as_current=False)
    use_ssl = ssl_options(redis_url)
    if use_ssl:
        app.conf.broker_use_ssl = use_ssl
    # broker_channel_error_retry: a refused write (OOM, READONLY, NOREPLICAS: a full Redis, a primary
    # demoted under the worker) restarts the consumer on a new connection instead of stopping the worker.
    app.conf.update(**SERIALIZATION, task_default_queue=queue,
                    broker_transport_options={**TRANSPORT, **connection, **(transport or {})},
                    broker_connection_retry_on_startup=True, broker_channel_error_retry=True, **conf)
    return app
