"""A TCP proxy between workers and Redis that holds traffic on cue: network faults from outside.

The tests point a worker's `REDIS_URL` at the proxy, which forwards each
connection to Redis on loopback. On cue it holds what the clients send (keeps
every connection open, forwards none of their bytes, answers nothing) and later
releases it:

- `hold_after_next_message()`: once a BRPOP reply that carries a message
  reaches a client, everything clients send after it is held. The flag is set
  before the reply is forwarded, so the worker's next command (kombu's record of
  the delivery as unacknowledged) cannot slip through: the window between
  kombu's take and its record, held open deterministically.
- `hold_all()`: a partition. Nothing a client sends reaches Redis; Redis's
  replies to what it already received still arrive (a partition that drops the
  return path too would only make the client wait longer for them).
- `release()`: held bytes go on, in order. A connection whose Redis died while it
  was held goes on to a fresh connection to `upstream` (Redis restarted on the same
  port), as a worker that was frozen between two commands reconnects its pool's
  stale connection before it sends.

When Redis dies, connections holding nothing are closed (as Redis's own would
be); held ones stay open until `release()`.
"""
from __future__ import annotations

import socket
import threading

from producer.local import free_port


class _Link:
    """One client connection and its upstream."""

    def __init__(self, proxy: "NetFault", client: socket.socket):
        self.proxy, self.client = proxy, client
        self.upstream: socket.socket | None = None
        self.held = bytearray()
        self.sent_brpop = False
        self.lock = threading.Lock()
        self.closed = False

    def start(self) -> None:
        self.upstream = socket.create_connection(self.proxy.upstream)
        threading.Thread(target=self._from_client, daemon=True).start()
        threading.Thread(target=self._from_upstream, args=(self.upstream,), daemon=True).start()

    def _from_client(self) -> None:
        while data := _recv(self.client):
            with self.lock:
                if b"BRPOP" in data.upper():
                    self.sent_brpop = True
                if self.proxy.holding or self.held:
                    self.held += data
                    continue
                if _send(self.upstream, data):  # under the lock: a release never overtakes it
                    continue
            break
        self.close()

    def _from_upstream(self, upstream: socket.socket) -> None:
        while data := _recv(upstream):
            if self.sent_brpop and data.startswith(b"*2\r\n"):
                self.sent_brpop = False
                self.proxy.on_message()
            if not _send(self.client, data):
                break
        with self.lock:
            if upstream is not self.upstream or self.closed:
                return
            if not self.held:  # Redis went away: so does this connection, as Redis's own would
                self.closed = True
            else:
                self.upstream = None  # held: it goes on to Redis as it is when released
                return
        self.close()

    def release(self) -> None:
        with self.lock:
            if self.closed:
                return
            data, self.held = bytes(self.held), bytearray()
            if self.upstream is None:
                try:
                    self.upstream = socket.create_connection(self.proxy.upstream)
                except OSError:
                    self.closed = True
                else:
                    threading.Thread(target=self._from_upstream, args=(self.upstream,), daemon=True).start()
            if self.upstream is not None and _send(self.upstream, data):
                return
        self.close()

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.upstream):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


class NetFault:
    """A proxy on a free loopback port in front of Redis at `upstream_port`."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self.holding = False
        self.message_held = threading.Event()
        self._armed = False
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def hold_after_next_message(self) -> None:
        self._armed = True

    def hold_all(self) -> None:
        self.holding = True

    def release(self) -> None:
        self.holding = False
        with self._lock:
            links = list(self._links)
        for link in links:
            link.release()

    def on_message(self) -> None:
        if self._armed:
            self._armed, self.holding = False, True
            self.message_held.set()

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for link in self._links:
                link.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            link = _Link(self, client)
            try:
                link.start()
            except OSError:  # Redis is down: refuse, as Redis would
                client.close()
                continue
            with self._lock:
                self._links = [x for x in self._links if not x.closed] + [link]


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket | None, data: bytes) -> bool:
    if sock is None:
        return False
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False
