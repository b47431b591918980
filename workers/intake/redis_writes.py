"""Whether Redis takes this worker's writes now, as its own writes find out.

A write refused as out of memory, read-only or without replicas
(`contract/redis_link/write_refusal.py`) marks Redis refusing; the next write that goes
through marks it accepting again. The health thread writes the worker's
heartbeat every `FLEET_HEALTH_INTERVAL`, so a refusal is noticed, and its end
too, within an interval even when no prompt is in hand. While Redis refuses,
the consumer gate takes no prompts (`workers/intake/gate.py`) and a prompt in hand
goes back to the queue uncounted (`workers/intake/tasks.py`), never to the dead
letters: its ledger entry is still `queued`, so the audit republishes it if
its message was lost with the refusal. Each change is logged once.
"""
from __future__ import annotations

import logging
import threading
import time

from contract.redis_link.write_refusal import WriteRefusal, refusal

log = logging.getLogger(__name__)


class RedisWrites:
    def __init__(self) -> None:
        self.refused: WriteRefusal | None = None
        self.since = 0.0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> bool:
        """A write failed with `exc`: True if Redis refused it (then noted), False for anything else."""
        found = refusal(exc)
        if found is None:
            return False
        with self._lock:
            if self.refused is None:
                self.since = time.monotonic()
                log.error("%s; taking no prompts until it takes writes again (prompts in hand go back "
                          "to the queue)", found.line())
            self.refused = found
        return True

    def accepted(self) -> None:
        """A write went through."""
        with self._lock:
            if self.refused is not None:
                log.warning("Redis takes writes again after %.0fs (was %s)", time.monotonic() - self.since,
                            self.refused.cause)
                self.refused = None
