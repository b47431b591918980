"""Celery's consumer, made to survive a Redis restart.

Seen with Celery 5.7.0 / kombu 5.7.0 (threads pool): when Redis restarts, the
consumer's clean-up calls `connection.collect()`, which can drop the
transport's client and then fail; the following `connection.close()` makes the
channel restore its unacknowledged messages, needs a new Redis client, and
raises `AttributeError: 'NoneType' object has no attribute 'hostname'`. The
consumer treats that as unrecoverable and never consumes again. Here that one
error is contained: the messages it could not restore stay in Redis's
`unacked` set, and the restore sweep (the lease) hands them out again.
"""
from __future__ import annotations

import logging

from celery.worker.consumer import Consumer

log = logging.getLogger(__name__)


class FleetConsumer(Consumer):
    def on_connection_error_after_connected(self, exc):
        connection = self.connection
        if connection is not None:
            close = connection.close

            def close_tolerating_lost_client() -> None:
                try:
                    close()
                except AttributeError as error:
                    log.warning("broker connection closed uncleanly (%r); unacknowledged prompts "
                                "return through the lease sweep", error)

            connection.close = close_tolerating_lost_client
        super().on_connection_error_after_connected(exc)
