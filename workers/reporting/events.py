"""Task events in batches: Flower sees every task; the worker pays for a few publishes a second.

Celery's worker buffers its task events (received, started, succeeded, failed)
and asks its event loop to flush the buffer on the loop's next turn. Under
load the loop turns for almost every event, so each event or two became its
own Redis PUBLISH: 17% of a busy worker's CPU (py-spy, 256 requests in flight,
~230 samples a second), more than its ledger calls.

Here the event loop flushes on a timer instead, every
`FLEET_TASK_EVENTS_INTERVAL` seconds, so one message carries every task event
of that interval (Celery's own `task.multi` batch, which Flower and every
Celery event receiver read as a list). A burst of more than `BUFFER_LIMIT`
events still flushes at once. Flower's task pages lag by at most the interval;
each event keeps the time it happened, so what they show is only late, never
wrong. Buffered events are flushed before the dispatcher is replaced (a broker
reconnect) and on shutdown, which Celery itself does not do for its batched
events.

Why 5 s by default, not 1 s: Redis's cost is round trips (~60 us of Redis CPU
each on the bench's VM, nearly whatever they carry), and a node at 2 samples a
second, which issue #34's 5,000 nodes run at, sends fewer events than one flush
carries: at 1 s its flushes were 0.50 of its 2.30 round trips a sample
(`python -m bench --parts fleet --fleet-sizes 1000`), at 5 s 0.10. The price is
Flower's task pages up to 5 s behind, the age `python -m producer status`'s
heartbeats already have (`FLEET_HEALTH_INTERVAL`); a worker's online state in
Flower rides on its worker-heartbeat events, which this does not batch. A busy
worker (~700 events a second) then sends ~3,500 events a flush, under
`BUFFER_LIMIT`.
"""
from __future__ import annotations

from celery import bootsteps

from . import lifeline

TROUBLE = lifeline.Trouble("task events to Redis")

BUFFER_LIMIT = 4096   # events; more in one interval and a task thread flushes a batch itself


class BatchedEvents(bootsteps.StartStopStep):
    """Flush the worker's task events from the event loop's timer (see module docstring).
    `FleetConsumer.on_send_event_buffered` no longer asks for a flush per event."""

    requires = {"celery.worker.consumer.events:Events"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self.tref = None

    def start(self, c) -> None:
        dispatcher = c.event_dispatcher
        if dispatcher is None or not c.hub:  # no event loop: Celery sends each event at once
            return
        dispatcher.buffer_limit = BUFFER_LIMIT
        self.tref = c.timer.call_repeatedly(c.app.fleet_settings.task_events_interval, flush, (c,), priority=5)

    def stop(self, c) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        flush(c)

    def shutdown(self, c) -> None:
        self.stop(c)


def flush(c) -> None:
    """Publish the buffered events; a failed publish keeps them in the dispatcher's outbound
    buffer, which Celery moves to the next dispatcher after a reconnect."""
    dispatcher = c.event_dispatcher
    if dispatcher is None:
        return
    try:
        dispatcher.flush()
        TROUBLE.ok()
    except Exception as exc:  # never let monitoring break the event loop
        TROUBLE.failed(exc)
