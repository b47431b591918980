"""Celery's consumer, made to survive a Redis restart.

Seen with Celery 5.7.0 / kombu 5.7.0 (threads pool): when Redis restarts, the
consumer's clean-up (`connection.collect()`) detaches the old transport from
its connection (`transport.client = None`). Tasks still running then finish
and acknowledge through their old channel, which needs a new Redis client,
reads its settings from `transport.client` and raises `AttributeError:
'NoneType' object has no attribute 'hostname'` on the event loop; the worker
calls that unrecoverable and stops consuming. Here the old transport keeps its
connection settings, so those acknowledgements reach the restarted Redis, and
an error while closing the dead connection is contained: whatever it could
not restore stays in Redis's unacked set for the lease sweep.
"""
from __future__ import annotations

import logging

from celery.worker.consumer import Consumer

from contract.kombu_redis import reattach, transport_of

log = logging.getLogger(__name__)


class FleetConsumer(Consumer):
    def on_connection_error_after_connected(self, exc):
        connection = self.connection
        transport = transport_of(connection)
        if connection is not None:
            close = connection.close

            def close_keeping_settings() -> None:
                reattach(transport, connection)
                try:
                    close()
                except AttributeError as error:
                    log.warning("broker connection closed uncleanly (%r); unacknowledged prompts "
                                "return through the lease sweep", error)
                reattach(transport, connection)

            connection.close = close_keeping_settings
        super().on_connection_error_after_connected(exc)
        reattach(transport, connection)
