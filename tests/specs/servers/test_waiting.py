"""A worker waiting on a server says why, again, while the wait lasts: a wrong port (connection
refused, for long) is told apart from a server that is there and warming up (503), through real
HTTP: a closed port, and a server answering /health with 503."""
from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contract.names import ServerState
from producer.local import free_port
from workers.servers.bindings import ServerPool
from workers.servers.health import HealthMonitor
from workers.servers.waiting import WaitNotes, duration
from workers.settings import Settings

L, W, D, H = ServerState.LOADING, ServerState.WARMING, ServerState.DOWN, ServerState.HEALTHY


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_server_unusable_for_long_is_said_again_first_after_a_minute_then_every_five():
    # Given a server that stays refused, probed every second
    clock = Clock()
    notes = WaitNotes(first_after=60, every=300, clock=clock)
    said = []
    for second in range(0, 700):
        clock.now = float(second)
        line = notes.note("http://a", L)
        if line:
            said.append((second, line))

    # Then it is said at 60 s, 360 s and 660 s, each time with how long it has lasted and both readings
    assert [s for s, _ in said] == [60, 360, 660]
    assert "connection refused for 11m" in said[2][1]
    assert "a wrong host or port in SGLANG_URLS" in said[0][1] and "still loading its model" in said[0][1]


def test_a_change_of_state_or_a_healthy_probe_starts_the_wait_again():
    clock = Clock()
    notes = WaitNotes(first_after=60, every=300, clock=clock)
    notes.note("http://a", L)
    clock.now = 59
    assert notes.note("http://a", W) is None  # loaded: now warming, a new wait
    clock.now = 118
    assert notes.note("http://a", W) is None
    clock.now = 119
    assert "503 for 1m" in notes.note("http://a", W)
    notes.note("http://a", H)
    clock.now = 500
    assert notes.note("http://a", W) is None and notes.note("http://b", D, "x") is None


def test_durations_read_as_a_person_would_say_them():
    assert [duration(s) for s in (5, 60, 61 * 60, 7500)] == ["5s", "1m", "1h01m", "2h05m"]


class Warming(BaseHTTPRequestHandler):
    """/health answers 503, as SGLang's does while it warms up; /readiness is not there."""

    def do_GET(self) -> None:
        self.send_response(503 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_) -> None:
        pass


@pytest.fixture
def warming_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Warming)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_log_tells_a_wrong_port_from_a_server_warming_up(warming_server, caplog):
    # Given a worker bound to a port nothing listens on and to a server warming up
    wrong = f"http://127.0.0.1:{free_port()}"
    settings = Settings(sglang_urls=f"{wrong},{warming_server}", health_timeout=5)
    pool = ServerPool([wrong, warming_server], 4)
    monitor = HealthMonitor(pool, settings, {}, waits=WaitNotes(first_after=0.2, every=60))

    # When its health checks have gone on past the first reminder
    with caplog.at_level(logging.INFO, logger="workers.servers.health"):
        for _ in range(2):
            for binding in pool.bindings:
                monitor.check(binding)
            time.sleep(0.3)
        for binding in pool.bindings:
            monitor.check(binding)

    # Then each server's state is what its probes said, and the log says what each wait means
    assert [b.state for b in pool.bindings] == [L, W]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2, lines
    refused, warming = sorted(lines, key=lambda line: warming_server in line)
    assert refused.startswith(f"server {wrong}: connection refused for 0s: either nothing listens there (a wrong "
                              "host or port in SGLANG_URLS?) or the server is still loading its model")
    assert warming.startswith(f"server {warming_server}: /health has answered 503 for 0s: the server is there "
                              "(the address is right) and warming up")
