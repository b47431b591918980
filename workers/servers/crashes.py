"""Whether a server that dropped a request died.

A request whose connection closed with no answer (`ServerDropped`) met either
a server that died (a crash of its engine takes every process with it: the
port then refuses connections) or an idle connection closed as the request
went out (the server is fine). `CrashWatch.crashed` tells them apart by
asking the server's `/health` right after the drop: a refused connection or a
dropped probe within `CONFIRM_SECONDS` is a crash; two good answers a second
apart are not, nor is a server that neither dies nor answers well in that time
(a wedged one: the health monitor handles it). The threads whose requests the same crash dropped (every
request in flight there) share one watch: one thread probes, the others wait
for its verdict, which covers every drop seen before the watch ended.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx

CONFIRM_SECONDS = 10.0  # a dying server's port closes within this after its engine fails
GOOD_ANSWERS = 2        # good /health answers, POLL_SECONDS apart, that say the server lives
POLL_SECONDS = 1.0


@dataclass
class _Watch:
    started: float
    done: threading.Event
    crashed_at: float | None = None  # wall-clock time of the first drop, when the server died


class CrashWatch:
    def __init__(self, client: httpx.Client, confirm_seconds: float = CONFIRM_SECONDS):
        self._client = client
        self._confirm = confirm_seconds
        self._lock = threading.Lock()
        self._watches: dict[str, _Watch] = {}

    def crashed(self, url: str, dropped: float, within: float | None = None) -> float | None:
        """When `url` died (the first drop's wall-clock time), if a request dropped at monotonic time
        `dropped` met its death (its port closed within `within` seconds, `CONFIRM_SECONDS` by default);
        None when the server lives."""
        with self._lock:
            watch = self._watches.get(url)
            mine = watch is None or (watch.done.is_set() and watch.started < dropped)
            if mine:
                watch = self._watches[url] = _Watch(time.monotonic(), threading.Event())
        if mine:
            watch.crashed_at = time.time() if self._died(url, within or self._confirm) else None
            watch.done.set()
        else:
            watch.done.wait()
        return watch.crashed_at

    def _died(self, url: str, within: float) -> bool:
        deadline, good = time.monotonic() + within, 0
        while time.monotonic() < deadline:
            try:
                answer = self._client.get(f"{url}/health", timeout=min(5.0, within))
                good = good + 1 if answer.status_code == 200 else 0
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                return True  # the port closed, or the server dropped this probe too
            except httpx.HTTPError:  # slow to answer: a busy or wedged server says nothing either way
                good = 0
            if good >= GOOD_ANSWERS:
                return False
            time.sleep(POLL_SECONDS)
        return False
