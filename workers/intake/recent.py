"""What a worker wrote lately, kept a while: what a failover may have lost, to write again.

Redis replicates asynchronously and Sentinel's rule is "last failover wins", so
a write the old primary took may be missing on the new one even when it was
reported; a worker keeps what it needs to assert again (its groups' done
marks, its acknowledgements) for `seconds`, longer than a failover takes to be
noticed (`workers/intake/failover.py`).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable


class Recent:
    """What was written lately, kept `seconds` (thread-safe): what a failover may have lost."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock = seconds, clock
        self._items: deque[tuple[float, Any]] = deque()
        self._lock = threading.Lock()

    def add(self, item: Any) -> None:
        now = self.clock()
        with self._lock:
            self._items.append((now, item))
            while self._items and now - self._items[0][0] > self.seconds:
                self._items.popleft()

    def items(self) -> list[Any]:
        now = self.clock()
        with self._lock:
            return [item for at, item in self._items if now - at <= self.seconds]


REMEMBER_S = 120.0  # how long what may need asserting after a failover is kept
ACKED = Recent(REMEMBER_S)  # the delivery tags this worker acknowledged lately
ADVANCED = Recent(REMEMBER_S)  # (run, turn id) of the conversation turns this worker moved past lately
