"""A server started again each time it dies, as a supervisor (Kubernetes, systemd, Slurm's requeue) would.

The killer-prompt tests need one: the stand-in's (`tests/servers/test_killer_prompt.py`, restarted at once,
faster than a health round) and the real SGLang server's (`tests/real/test_server_crash.py`, after a back-off
that doubles, as Kubernetes' CrashLoopBackOff). Both ask it the same two things: when the server died, and
that it comes back on its port.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Generic, TypeVar

Server = TypeVar("Server")


class Supervisor(Generic[Server]):
    """Watches `server` (`alive`) and, each time it died, notes when (`deaths`, epoch seconds) and starts it
    again (`restart(dead) -> new`), after `backoff` seconds doubling with each death (0: at once). Once
    stopped, a restart still waiting out its back-off is never made."""

    def __init__(self, server: Server, alive: Callable[[Server], bool], restart: Callable[[Server], Server],
                 backoff: float = 0.0, poll: float = 0.2):
        self.server, self.deaths = server, []
        self._alive, self._restart, self._backoff, self._poll = alive, restart, backoff, poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            if self._alive(self.server):
                continue
            self.deaths.append(time.time())
            if self._backoff and self._stop.wait(self._backoff * 2 ** (len(self.deaths) - 1)):
                return
            self.server = self._restart(self.server)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
