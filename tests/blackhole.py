"""A TCP proxy in front of a server whose host can vanish on cue: a black hole, from outside.

The tests point a worker at the proxy's port, which forwards each connection
to the server on loopback. `vanish()` turns it into what a host that dropped
off the network looks like to its clients:

- connections already open stay open and carry nothing either way (no reset,
  no FIN: a read waits until its own deadline);
- new connections time out: the proxy stops accepting and fills its listen
  queue, so the kernel drops further SYNs unanswered (not refused).

Loopback only; `close()` ends every connection and thread it made.
"""
from __future__ import annotations

import socket
import threading

from producer.local import free_port

BACKLOG = 16


class BlackHole:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port), backlog=BACKLOG)
        self.vanished = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def vanish(self) -> None:
        """From now on: open connections carry nothing, new ones time out."""
        self.vanished.set()
        for _ in range(BACKLOG * 3):  # the listen queue full: later SYNs go unanswered
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self._keep(filler)

    def close(self) -> None:
        self.vanished.set()
        self.listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self.vanished.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self._keep(client)
            if self.vanished.is_set():
                return  # accepted as it vanished: held open, carrying nothing
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self._keep(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if self.vanished.is_set():
                return  # the host is gone: nothing more reaches either side, nothing is closed
            if not data:
                break
            try:
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
