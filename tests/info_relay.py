"""A TCP relay in front of a server that drops connections asking for its info routes.

What a worker sees of a server behind a gateway on a network it cannot reach:
the gateway gets through (its health checks and `/generate` are relayed, bytes
as they are), while a connection whose first request reads `/server_info`,
`/model_info`, `/v1/models` or the load routes, as the worker's preflight does,
is closed without an answer. The first request of each connection decides
for the whole connection.
"""
from __future__ import annotations

import socket
import threading

from producer.local import free_port

BLOCKED = ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models", "/v1/loads",
           "/get_load")


class InfoRelay:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dropped = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n" not in head:
            chunk = client.recv(65536)
            if not chunk:
                client.close()
                return
            head += chunk
        path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else ""
        if path.split("?")[0] in BLOCKED:
            self.dropped += 1
            client.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        upstream.sendall(head)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()
