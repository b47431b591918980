"""A whole request's deadline, however its server sends (or withholds) the bytes.

A socket's read timeout bounds one read: a server that trickles a byte every
few seconds, or sends its head and then goes silent, keeps a request alive
far past it. Two clients, one rule: every wait of a request to a server ends
by the request's deadline.

`/generate` (`workers/servers/sglang_client.py` over `http1.py`): a watchdog bounds the whole
exchange. A request arms it with its socket and deadline just before waiting
for the answer's head, and disarms it once the body is read. One daemon
thread wakes every `tick` and shuts down the socket of every armed request
past its deadline; the blocked read then returns at once (end of stream), and
`disarm` tells the request that the deadline, not the server, ended it, so its
connection is closed rather than pooled. A request can also be cut before its
deadline (`Watch.cut`: its server was marked down), armed or not yet.

The watchdog shuts a socket at the socket level (shutdown(2) on its
descriptor, under its lock, which `disarm` takes before the owner may close
it): a TLS socket's state stays its reading thread's, which meets an end of
stream or an `ssl.SSLError` (an `OSError`), never a `ValueError`.

Health, preflight, tokenizer-probe, load and crash reads (httpx,
`workers/servers/health.py`): `deadline_client` gives every network wait of
a request (connect, TLS, each write and read, of the head and of the body) at
most the time left to the request's deadline, set when the request starts;
past it the wait raises httpx's timeout error. No thread is needed: the waits
are in the caller's. It stands on the public API of both libraries: an
`httpx.BaseTransport` over an `httpcore.ConnectionPool` with a network backend
of ours, the worker's one TLS context (`tls.py`) and its keep-alive expiry.

Invariants: a watched request armed at time t with deadline d ends by d + tick
(plus the time to run its own exception handler); a cut one within a tick of
the cut. Arming and disarming are O(1) (a dict under a lock held for one
insert or pop); the thread's scan is O(armed requests) once per tick, not
per request, so the cost per request does not grow with the number in
flight. An httpx request started at t with a whole-call timeout w ends by
t + w plus one scheduling delay.
"""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterable, Iterator

import httpcore
import httpx

from . import tls
from .http1 import KEEPALIVE


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


_call = threading.local()  # .deadline: the calling thread's httpx request's, on time.monotonic()


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """A wait's timeout, cut to the time left to the current request's deadline."""
    deadline = getattr(_call, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise late("the request's whole-call deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout),
                                               local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    """An httpcore answer's body as httpx reads it, its errors as httpx's."""

    def __init__(self, response: httpcore.Response) -> None:
        self._response = response

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx():
            yield from self._response.iter_stream()

    def close(self) -> None:
        with _as_httpx():
            self._response.close()


class _Transport(httpx.BaseTransport):
    """httpcore's connection pool over the backend above, behind httpx's transport interface (both
    libraries' public API): the worker's TLS context, idle connections dropped after `keepalive`
    seconds, each request's deadline set as it starts."""

    def __init__(self, whole: float, keepalive: float) -> None:
        self._pool = httpcore.ConnectionPool(ssl_context=tls.context(), keepalive_expiry=keepalive,
                                             network_backend=_Backend())
        self._whole = whole

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        # The body is read after this returns, by the same thread, under the same deadline.
        _call.deadline = time.monotonic() + self._whole
        url = request.url
        with _as_httpx():
            response = self._pool.handle_request(httpcore.Request(
                request.method, httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                             target=url.raw_path),
                headers=request.headers.raw, content=request.stream, extensions=request.extensions))
        return httpx.Response(response.status, headers=response.headers, stream=_Body(response),
                              extensions=response.extensions)

    def close(self) -> None:
        self._pool.close()


_HTTPX = {getattr(httpcore, name): getattr(httpx, name) for name in (
    "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "TimeoutException", "ConnectError",
    "ReadError", "WriteError", "NetworkError", "RemoteProtocolError", "LocalProtocolError", "ProtocolError",
    "ProxyError", "UnsupportedProtocol")}


@contextmanager
def _as_httpx() -> Iterator[None]:
    """httpcore's errors raised as httpx's of the same name (the cause kept), as callers catch them."""
    try:
        yield
    except Exception as exc:
        kind = next((_HTTPX[k] for k in type(exc).__mro__ if k in _HTTPX), None)
        if kind is None:
            raise
        raise kind(str(exc)) from exc


def deadline_client(whole: float, headers: dict[str, str], keepalive: float = KEEPALIVE) -> httpx.Client:
    """An httpx client each of whose requests ends within `whole` seconds in all."""
    return httpx.Client(transport=_Transport(whole, keepalive), timeout=whole, headers=headers)
