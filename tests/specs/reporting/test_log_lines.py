"""A prompt handed back is one line in the worker's log: Celery's record of a rejected task loses its
traceback, and no other record does."""
from __future__ import annotations

import io
import logging
import sys

from celery.exceptions import Reject

from workers.reporting.log_lines import HandedBackInOneLine


def _logged(exc: BaseException) -> str:
    """What a logger with the filter writes for a warning carrying `exc`, as Celery's tracer logs it."""
    out = io.StringIO()
    logger = logging.Logger("celery.app.trace")
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.addFilter(HandedBackInOneLine())
    try:
        raise exc
    except BaseException:
        logger.warning("Task fleet.generate[default:p-0001] %r", exc, exc_info=sys.exc_info())  # as Celery does
    return out.getvalue()


def test_a_rejected_task_is_logged_in_one_line_saying_why():
    # Given a prompt handed back because no server was healthy, chained to its cause
    try:
        try:
            raise RuntimeError("no healthy server for model any within 30s")
        except RuntimeError as cause:
            raise Reject(str(cause), requeue=True) from cause
    except Reject as rejected:
        # When the tracer logs it, Then the log holds its one line, with the reason, and no traceback
        assert _logged(rejected).splitlines() == [
            "Task fleet.generate[default:p-0001] reject requeue=True: no healthy server for model any within 30s"]


def test_any_other_error_keeps_its_traceback():
    # Given an error that is not a hand-back, When it is logged, Then its traceback is there
    text = _logged(ValueError("a bug"))
    assert "Traceback (most recent call last)" in text and "ValueError: a bug" in text.splitlines()[-1]
