"""A TCP proxy between a worker and Redis that cuts a connection after Redis ran the take's script.

Every byte goes through unchanged, but for the first `cuts` calls of one script (recognised by its
SHA1 in an EVALSHA a client sends): that command is forwarded to Redis whole, Redis runs it and
answers, and the proxy then closes both sides of the connection instead of forwarding the answer.
The client sees its connection drop after the script ran, the window `kombu_take`'s token closes.
"""
from __future__ import annotations

import socket
import threading

from producer.local import free_port


class CutAfterScript:
    def __init__(self, upstream_port: int, sha: str, cuts: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.sha = sha.encode()
        self.cuts_left = cuts
        self.cut: list[bytes] = []  # the first bytes of each answer swallowed: what Redis replied
        self._lock = threading.Lock()
        self.port = free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            link = {"swallow": False}
            threading.Thread(target=self._from_client, args=(client, upstream, link), daemon=True).start()
            threading.Thread(target=self._from_upstream, args=(client, upstream, link), daemon=True).start()

    def _from_client(self, client: socket.socket, upstream: socket.socket, link: dict) -> None:
        while data := _recv(client):
            if self.sha in data:
                with self._lock:
                    if self.cuts_left > 0:
                        self.cuts_left -= 1
                        link["swallow"] = True  # before the command reaches Redis: its answer is not forwarded
            if not _send(upstream, data):
                break
        _close(client, upstream)

    def _from_upstream(self, client: socket.socket, upstream: socket.socket, link: dict) -> None:
        while data := _recv(upstream):
            if link["swallow"]:
                with self._lock:
                    self.cut.append(data[:16])
                break  # Redis ran it and answered: the connection drops before the answer reaches the client
            if not _send(client, data):
                break
        _close(client, upstream)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
