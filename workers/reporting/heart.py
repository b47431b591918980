"""Celery's worker-heartbeat events, sent without kombu's retry loop: a consumer bootstep of the fleet's.

Celery sends a heartbeat from the event loop's timer (`celery.worker.heartbeat.Heart._send`) with
`retry=True` and no retry policy, so one sent while Redis is down reconnects the events connection
until Redis is back, holding the loop all that while (py-spy: `Heart._send` ->
`Connection._ensure_connection`): the worker noticed the lost broker only then. Sent without the
retry, a heartbeat Redis cannot take waits in the dispatcher's outbound buffer, which the next flush
sends (`events.py`). Flower reads these events (the interval, `FleetConsumer`'s).

The step takes the place of Celery's own `Heart` step in the fleet's consumer blueprint
(`workers/intake/consumer.py`: `FleetConsumer.Blueprint`), so exactly one heartbeat is sent; it is
Celery's step and Celery's heartbeat, the latter built with `_send` overridden in a subclass.
"""
from __future__ import annotations

from celery.worker import heartbeat
from celery.worker.consumer import heart

CELERY_STEP = "celery.worker.consumer.heart:Heart"
STEP = "workers.reporting.heart:Heart"


class Heartbeat(heartbeat.Heart):
    """Celery's heartbeat, each event sent once, never retried."""

    def _send(self, event, retry=True):
        return super()._send(event, retry=False)


class Heart(heart.Heart):
    """Celery's heartbeat step, sending through `Heartbeat`."""

    def start(self, c):
        c.heart = Heartbeat(c.timer, c.event_dispatcher, self.heartbeat_interval)
        c.heart.start()
