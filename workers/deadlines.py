"""A whole request's deadline, however its server sends (or withholds) the bytes.

A socket's read timeout bounds one read: a server that trickles a byte every
few seconds, or sends its head and then goes silent, keeps a request alive
far past it. The watchdog bounds the whole exchange instead: a request arms
it with its socket and deadline just before waiting for the answer's head,
and disarms it once the body is read. One daemon thread wakes every `tick`
and shuts down the socket of every armed request past its deadline; the
blocked read then returns at once (end of stream), and `disarm` tells the
request that the deadline, not the server, ended it, so its connection is
closed rather than pooled.

Invariant: a request armed at time t with deadline d ends by d + tick (plus
the time to run its own exception handler). Arming and disarming are O(1)
(a dict under a lock held for one insert or pop); the thread's scan is
O(armed requests) once per tick, not per request, so the cost per request
does not grow with the number in flight.
"""
from __future__ import annotations

import socket
import threading
import time


class DeadlineWatchdog:
    def __init__(self, tick: float = 0.25) -> None:
        self._tick = tick
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, deadline: float) -> int:
        """Watch `sock` until `disarm(key)`; shut it down once `time.monotonic()` passes `deadline`."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleet-http-deadlines", daemon=True)
                self._thread.start()
            self._next += 1
            self._armed[self._next] = (deadline, sock)
            return self._next

    def disarm(self, key: int) -> bool:
        """True if the request ended before its deadline; False if the watchdog shut its socket."""
        with self._lock:
            return self._armed.pop(key, None) is not None

    def _run(self) -> None:
        while True:
            time.sleep(self._tick)
            self.fire(time.monotonic())

    def fire(self, now: float) -> int:
        """Shut down every armed socket whose deadline is past `now`; how many."""
        with self._lock:
            late = [key for key, (deadline, _) in self._armed.items() if deadline <= now]
            socks = [self._armed.pop(key)[1] for key in late]
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by its own thread
                pass
        return len(socks)


class Watch:
    """One request's deadline: armed by the connection when it has a socket, disarmed by the caller."""

    __slots__ = ("dog", "deadline", "key", "fired")

    def __init__(self, dog: DeadlineWatchdog, deadline: float) -> None:
        self.dog, self.deadline, self.key, self.fired = dog, deadline, None, False

    def arm(self, sock: socket.socket) -> None:
        self.disarm()  # a second response on the same request (none today) re-arms, never leaks
        self.key = self.dog.arm(sock, self.deadline)

    def disarm(self) -> bool:
        """True unless the watchdog cut this request (sticky once it has)."""
        if self.key is not None:
            self.fired = self.fired or not self.dog.disarm(self.key)
            self.key = None
        return not self.fired
