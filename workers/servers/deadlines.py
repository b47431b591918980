"""A whole request's deadline, however its server sends (or withholds) the bytes.

A socket's read timeout bounds one read: a server that trickles a byte every
few seconds, or sends its head and then goes silent, keeps a request alive
far past it. One rule for every request to a server, `/generate`
(`sglang_client.py`) and the health, preflight, tokenizer-probe, load and
crash reads (`reads.py`) alike, all over `http1.py`: every wait of a request
ends by the request's deadline.

A watchdog bounds the whole exchange. A request arms it with its socket and
deadline just before writing the request, and disarms it once the body is
read. One daemon thread (`WATCHDOG`, the process's one) wakes every `tick`
and shuts down the socket of every armed request past its deadline; the
blocked read then returns at once (end of stream), and `disarm` tells the
request that the deadline, not the server, ended it, so its connection is
closed rather than pooled. A request can also be cut before its deadline
(`Watch.cut`: its server was marked down), armed or not yet. Before the
watch is armed, connecting waits at most the connect timeout, which a read
sets to no more than the time left to its deadline (`reads.py`); `/generate`'s
is `FLEET_CONNECT_TIMEOUT`, far inside its deadline.

The watchdog shuts a socket at the socket level (shutdown(2) on its
descriptor, under its lock, which `disarm` takes before the owner may close
it): a TLS socket's state stays its reading thread's, which meets an end of
stream or an `ssl.SSLError` (an `OSError`), never a `ValueError`.

Invariants: a watched request armed at time t with deadline d ends by d + tick
(plus the time to run its own exception handler); a cut one within a tick of
the cut. Arming and disarming are O(1) (a dict under a lock held for one
insert or pop); the thread's scan is O(armed requests) once per tick, not
per request, so the cost per request does not grow with the number in
flight.
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

    def shut(self, key: int) -> None:
        """Shut the socket armed under `key` now (a cut): `disarm(key)` then says False."""
        with self._lock:
            found = self._armed.pop(key, None)
            if found is not None:
                _shut(found[1])

    def _run(self) -> None:
        while True:
            time.sleep(self._tick)
            self.fire(time.monotonic())

    def fire(self, now: float) -> int:
        """Shut down every armed socket whose deadline is past `now`; how many."""
        with self._lock:
            late = [key for key, (deadline, _) in self._armed.items() if deadline <= now]
            for key in late:
                _shut(self._armed.pop(key)[1])
        return len(late)


def _shut(sock: socket.socket) -> None:
    """shutdown(2) on the socket's descriptor, TLS or not. Called under the watchdog's lock, which
    `disarm` takes before the owner closes the socket, so the descriptor is still this socket's.
    Not `SSLSocket.shutdown`: that also drops the TLS state under the thread reading it (a
    `ValueError` there, not an `OSError`); at the socket level, that read just meets the end."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # not connected (any more)
        pass


class Watch:
    """One request's deadline: armed by the connection when it has a socket, disarmed by the caller."""

    __slots__ = ("dog", "deadline", "key", "fired", "cut_because")

    def __init__(self, dog: DeadlineWatchdog, deadline: float) -> None:
        self.dog, self.deadline, self.key, self.fired = dog, deadline, None, False
        self.cut_because: str | None = None

    def arm(self, sock: socket.socket) -> None:
        self.disarm()  # a second response on the same request (none today) re-arms, never leaks
        self.key = key = self.dog.arm(sock, self.deadline)
        if self.cut_because is not None:  # cut while it connected or sent: end it at once
            self.dog.shut(key)

    def cut(self, why: str) -> None:
        """End the request now, armed or not (its server was marked down); `disarm` then says False.
        Either this sees the key `arm` set, or `arm` sees the reason set here: one of them shuts."""
        self.cut_because = why
        key = self.key
        if key is not None:
            self.dog.shut(key)

    def disarm(self) -> bool:
        """True unless the watchdog cut this request (sticky once it has)."""
        if self.key is not None:
            self.fired = self.fired or not self.dog.disarm(self.key)
            self.key = None
        return not self.fired


WATCHDOG = DeadlineWatchdog()  # the process's: every request to a server is watched by this one thread
