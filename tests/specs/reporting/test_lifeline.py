"""Errors a worker's threads survive are logged once per change, never once per attempt."""
from __future__ import annotations

import logging

from workers.reporting.lifeline import Trouble


def test_a_recurring_error_is_logged_when_it_starts_changes_and_ends(caplog):
    # Given a heartbeat that fails five times with one error, twice with another, then works
    trouble = Trouble("heartbeat to Redis")
    with caplog.at_level(logging.WARNING, logger="workers.reporting.lifeline"):
        for _ in range(5):
            trouble.failed(ConnectionError("Connection refused"))
        for _ in range(2):
            trouble.failed(TimeoutError("Timeout reading from socket"))
        trouble.ok()
        trouble.ok()

    # Then three lines at WARNING say so: the start, the change, the end
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "heartbeat to Redis failing: ConnectionError: Connection refused "
                          "(logged again when it changes or ends)"),
        (logging.WARNING, "heartbeat to Redis failing: TimeoutError: Timeout reading from socket "
                          "(logged again when it changes or ends)"),
        (logging.WARNING, "heartbeat to Redis working again after 7 failures "
                          "(last: TimeoutError: Timeout reading from socket)"),
    ]
