"""What a worker says while one of its servers stays unusable, so a wait has a reason in the log.

The health monitor logs each state change once: a worker started against a wrong
port logs `unknown -> loading (connection refused ...)` and then nothing, forever,
which reads exactly like a model still loading its weights (SGLang refuses
connections until the weights are in GPU memory, minutes for a big model). The two
part ways only with time: a loading server starts answering, `/health` with 503
while it warms up, then 200; a wrong address never answers. So while a server stays
refused (or warming, or down) the worker says so again, first after
`FIRST_AFTER` seconds and then every `EVERY` seconds, with how long it has lasted and
what each state means: connection refused for long is a wrong host or port in
SGLANG_URLS or a model still loading (its own log tells which); 503 means the server
is there and warming up (or draining, or stuck). `WaitNotes` is that bookkeeping,
apart from the logging, with an injectable clock.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from .bindings import DOWN, LOADING, WARMING

FIRST_AFTER = 60.0   # seconds unusable before the first reminder
EVERY = 300.0        # seconds between reminders while it lasts


def duration(seconds: float) -> str:
    """`45s`, `12m`, `2h05m`: how long a wait has lasted, for a log line."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def reminder(url: str, state: str, lasted: float, detail: str) -> str | None:
    """The line for a server unusable in `state` for `lasted` seconds, or None (usable, refused)."""
    for_ = duration(lasted)
    if state == LOADING:
        return (f"server {url}: connection refused for {for_}: either nothing listens there (a wrong host or port "
                f"in SGLANG_URLS?) or the server is still loading its model (its own log shows the weights "
                f"loading); a loaded server answers /health with 503 while it warms up, then 200")
    if state == WARMING:
        return (f"server {url}: /health has answered 503 for {for_}: the server is there (the address is right) "
                f"and warming up, draining after SIGTERM, or stuck; see its own log")
    if state == DOWN:
        return f"server {url}: down for {for_} ({detail}); see the server's own log"
    return None


class WaitNotes:
    """Per server: since when it has been in its unusable state, and when to say so next."""

    def __init__(self, first_after: float = FIRST_AFTER, every: float = EVERY,
                 clock: Callable[[], float] = time.monotonic):
        self.first_after, self.every, self.clock = first_after, every, clock
        self._since: dict[str, tuple[str, float, float]] = {}  # url -> (state, since, next reminder)
        self._lock = threading.Lock()

    def note(self, url: str, state: str, detail: str = "") -> str | None:
        """Record the server's state after a probe; the reminder to log now, if one is due."""
        now = self.clock()
        with self._lock:
            if state not in (LOADING, WARMING, DOWN):
                self._since.pop(url, None)
                return None
            was = self._since.get(url)
            if was is None or was[0] != state:
                self._since[url] = (state, now, now + self.first_after)
                return None
            _, since, due = was
            if now < due:
                return None
            self._since[url] = (state, since, now + self.every)
        return reminder(url, state, now - since, detail)
