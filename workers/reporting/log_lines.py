"""What the worker's log says of a prompt handed back: one line, never a traceback.

A prompt is handed back to its queue (Celery's `Reject`, requeued) when no
healthy server is left for it within FLEET_SERVER_WAIT, when Redis refuses
writes, or when a shutdown cuts its work short. Celery logs each at WARNING
with the whole traceback, chained causes included (thirty lines), and a
server restart hands back every prompt the worker holds at once: hundreds of
tracebacks of an expected event, which bury the lines that matter. The line
Celery writes already says why (`Task fleet.generate[run:id] reject
requeue=True: no healthy server ...`); an unexpected error that ends in a
hand-back has its traceback logged where it is caught
(`workers/intake/tasks.py`), so nothing is lost by dropping this one.
"""
from __future__ import annotations

import logging

from celery.exceptions import Reject

TRACER = "celery.app.trace"  # the logger Celery writes a task's outcome to


class HandedBackInOneLine(logging.Filter):
    """Drops the traceback from a record of a rejected task; every other record passes untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], Reject):
            record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    logging.getLogger(TRACER).addFilter(HandedBackInOneLine())
