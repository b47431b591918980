"""One HTTP/1.1 POST on a pooled keep-alive socket: the bytes out, the status and body back.

Why not urllib3 or `http.client`: at hundreds of samples a second the worker is
CPU-bound, and their per-request Python (header objects, `email.parser` for the
answer's head, urllib3's response wrapper) cost ~390 us of CPU a call against
~100 us for the same exchange on a bare socket (`python -m bench.http_clients`),
with more system calls (each one a chance to hand the GIL to another of the
worker's hundreds of threads). `/generate` needs little of HTTP: one POST of a
JSON body, an answer framed by Content-Length (or chunked, behind a proxy), a
keep-alive connection per server. That much is here; everything about what the
answer means stays in `sglang_client.py`.

Invariants: a connection goes back to its pool only after an answer was read
to its exact end under HTTP/1.1 keep-alive (`Exchange.reusable`); any other
(cut at the size cap, an error, `Connection: close`, HTTP/1.0, read to the end
of the stream) is closed. A pooled connection the server has closed or written
to while idle is never reused (checked with a zero-timeout poll before each
use, as urllib3 does). Every read waits at most the read timeout; the whole
exchange's deadline is the caller's (its watchdog shuts the socket, and
`read_answer` checks it between reads). The pool is last-in-first-out, so its
cost per request does not depend on how many requests are in flight.
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass

CHUNK = 65536
MAX_HEAD = 65536  # bytes of status line and headers; a longer head is no SGLang answer
FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})  # the only fields read


class ProtocolError(OSError):
    """The server broke HTTP/1.1 or closed the connection mid-answer (an `OSError`, like a reset)."""


class NoAnswer(ProtocolError):
    """The server closed the connection before the first byte of an answer (a crash, or an idle close)."""


@dataclass
class Exchange:
    status: int
    body: bytes       # at most the cap
    complete: bool    # False: the body went on past the cap and was cut off there
    reusable: bool    # read to its exact end, keep-alive: the connection may serve another request


class Connection:
    """A socket and the bytes read past the last answer's end (none, for a well-behaved server)."""

    __slots__ = ("sock", "buffer")

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def dropped(self) -> bool:
        """Closed, reset or written to by the server while idle: not to be used again."""
        if self.buffer:
            return True
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Pool:
    """Keep-alive connections to one origin, last in first out, at most `size` idle ones kept."""

    def __init__(self, scheme: str, host: str, port: int, size: int, connect_timeout: float,
                 read_timeout: float, tls: ssl.SSLContext | None = None):
        self.host, self.port, self.size = host, port, size
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._tls = tls if scheme == "https" else None
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self.host_header = host if ":" not in host else f"[{host}]"
        if port != (443 if scheme == "https" else 80):
            self.host_header += f":{port}"

    def get(self) -> Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            if not conn.dropped():
                return conn
            conn.close()

    def put(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _connect(self) -> Connection:
        sock = socket.create_connection((self.host, self.port), timeout=self._connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self._read_timeout)
        except BaseException:
            sock.close()
            raise
        return Connection(sock)


def request_head(pool: Pool, path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {pool.host_header}", f"Content-Length: {length}",
             "Accept-Encoding: identity", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_answer(conn: Connection, deadline: float, max_bytes: int) -> Exchange:
    """The answer to the request just sent: its head, then its body up to `max_bytes`.
    Raises `TimeoutError` (a read outlasted the read timeout), `ProtocolError`, `OSError`, or
    `DeadlinePassed` (between reads, past `deadline`)."""
    data, version, status, fields = _head(conn, deadline)
    length, chunked = fields.get("content-length"), "chunked" in fields.get("transfer-encoding", "")
    keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "")
    if chunked:
        return _chunked(conn, data, status, keep, deadline, max_bytes)
    if length is None:  # framed by the end of the stream
        body, complete = _until_close(conn, data, deadline, max_bytes)
        return Exchange(status, body, complete, False)
    try:
        size = int(length)
    except ValueError:
        raise ProtocolError(f"bad Content-Length {length!r}") from None
    body, complete = _exactly(conn, data, size, deadline, max_bytes)
    return Exchange(status, body, complete, keep and complete)


class DeadlinePassed(Exception):
    """The whole exchange's deadline passed between two reads; `size`: body bytes read so far."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


def _recv(conn: Connection, deadline: float, size: int) -> bytes:
    if time.monotonic() > deadline:
        raise DeadlinePassed(size)
    chunk = conn.sock.recv(CHUNK)
    if not chunk:
        raise ProtocolError("the server closed the connection before the answer's end")
    return chunk


def _head(conn: Connection, deadline: float) -> tuple[bytes, str, int, dict[str, str]]:
    """Skips interim (1xx) answers; returns the bytes after the head, version, status and fields."""
    data = conn.buffer
    conn.buffer = b""
    while True:
        end = data.find(b"\r\n\r\n")
        while end < 0:
            if len(data) > MAX_HEAD:
                raise ProtocolError(f"answer head longer than {MAX_HEAD} bytes")
            try:
                data += _recv(conn, deadline, 0)
            except ConnectionResetError as exc:
                if data:
                    raise
                raise NoAnswer(f"the server reset the connection before any answer ({exc})") from exc
            except ProtocolError as exc:
                if data:
                    raise
                raise NoAnswer("the server closed the connection before any answer") from exc
            end = data.find(b"\r\n\r\n")
        lines = data[:end].decode("latin-1").split("\r\n")
        data = data[end + 4:]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP status line: {lines[0][:100]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            continue
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name in FRAMING:
                fields[name] = value.strip().lower()
        return data, parts[0], status, fields


def _exactly(conn: Connection, data: bytes, size: int, deadline: float, max_bytes: int) -> tuple[bytes, bool]:
    want = min(size, max_bytes + 1)
    chunks, got = [data], len(data)
    while got < want:
        chunk = _recv(conn, deadline, got)
        chunks.append(chunk)
        got += len(chunk)
    body = b"".join(chunks) if len(chunks) > 1 else data
    if size > max_bytes:
        return body[:max_bytes], False
    conn.buffer = body[size:]  # a server that wrote past its answer: `dropped` then refuses the connection
    return body[:size], True


def _until_close(conn: Connection, data: bytes, deadline: float, max_bytes: int) -> tuple[bytes, bool]:
    chunks, got = [data], len(data)
    while got <= max_bytes:
        if time.monotonic() > deadline:
            raise DeadlinePassed(got)
        chunk = conn.sock.recv(CHUNK)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)[:max_bytes], False


def _chunked(conn: Connection, data: bytes, status: int, keep: bool, deadline: float,
             max_bytes: int) -> Exchange:
    body: list[bytes] = []
    got = 0
    while True:
        while (end := data.find(b"\r\n")) < 0:
            data += _recv(conn, deadline, got)
        try:
            size = int(data[:end].split(b";", 1)[0], 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size line {data[:end][:40]!r}") from None
        data = data[end + 2:]
        if size == 0:  # the last chunk; then trailers, if any, and an empty line
            while (end := data.find(b"\r\n")) != 0:
                if end > 0:
                    data = data[end + 2:]
                else:
                    data += _recv(conn, deadline, got)
            conn.buffer = data[2:]
            return Exchange(status, b"".join(body), True, keep)
        while len(data) < size + 2:
            data += _recv(conn, deadline, got + len(data))
        body.append(data[:size])
        got += size
        data = data[size + 2:]
        if got > max_bytes:
            return Exchange(status, b"".join(body)[:max_bytes], False, False)
