"""One HTTP/1.1 request on a pooled keep-alive socket: the bytes out, the status and body back.

Why not urllib3 or `http.client`: at hundreds of samples a second the worker is
CPU-bound, and their per-request Python (header objects, `email.parser` for the
answer's head, urllib3's response wrapper) cost ~390 us of CPU a call against
~100 us for the same exchange on a bare socket (`python -m bench.http_clients`),
with more system calls (each one a chance to hand the GIL to another of the
worker's hundreds of threads). `/generate` needs little of HTTP: one POST of a
JSON body, an answer framed by Content-Length (or chunked, behind a proxy), a
keep-alive connection per server. The socket, the pool and the deadline are
here; the answer is parsed by llhttp (Node's parser, through `httptools`),
chosen over h11 by CPU per request (`python -m bench --parts http`); everything
about what the answer means stays in `sglang_client.py`.

It is the worker's one HTTP stack: the health, preflight, tokenizer-probe,
load and crash reads (`reads.py`, an httpx client over this module) go through
the same pools, one per origin and keep-alive in the process (`shared_pool`),
as `/generate`, with its one TLS context (`tls.py`). A read is a GET (or a
small POST) whose answer's headers are kept (`read_answer(headers=True)`);
`/generate`'s answers keep none, and pay nothing for the option.

Invariants:
- Framing is llhttp's, strict: a 1xx, 204 or 304 has no body (interim 1xx
  answers are skipped); a Content-Length is ASCII digits, given once, never
  beside Transfer-Encoding; chunk sizes are hex digits and each chunk's data
  ends with CRLF; a status line that is not `HTTP/x.y DDD` is refused. Every
  breach is a `ProtocolError` (an `OSError`), never another exception type.
- The body is read under the cap: at most `max_bytes` plus one read
  (`CHUNK`) is ever held, whatever a Content-Length or chunk size claims, and
  the pieces are joined once.
- A connection goes back to its pool only after an answer was read to its
  exact end with keep-alive and nothing after it (`Exchange.reusable`); any
  other (cut at the cap, an error, `Connection: close`, HTTP/1.0, framed by
  the end of the stream, bytes past the answer) is closed.
- An idle connection is used again only within `keepalive` seconds of its
  last answer (below the server's own idle timeout: uvicorn's 5 s) and only
  if the server has neither closed it nor written to it meanwhile (a
  zero-timeout poll, as urllib3 does). The pool is last-in-first-out, so its
  cost per request does not depend on how many requests are in flight, and
  when its newest idle connection is too old, all are.
- A failure before the request was written says which (`NotSent`), and so
  does a close with no byte of answer (`NoAnswer`): the caller can tell a
  stale reused connection (try once more on a fresh one) from a server that
  went away (`exchange` does: once, on a fresh connection, within the same
  deadline). Connecting waits at most the connect timeout; every read at most
  the read timeout, both given per request (a connection serves requests with
  different ones: it is set on its socket only when it changes); the whole
  exchange's deadline is the caller's (its watchdog shuts the socket, and
  `read_answer` checks it between reads).
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Mapping, Protocol

import httptools

CHUNK = 65536
MAX_HEAD = 65536  # bytes of status line and headers; a longer head is no SGLang answer
KEEPALIVE = 4.0  # FLEET_KEEPALIVE_SECONDS's default: below SGLang's uvicorn's 5 s idle timeout


class ProtocolError(OSError):
    """The server broke HTTP/1.1 or closed the connection mid-answer (an `OSError`, like a reset)."""


class NoAnswer(ProtocolError):
    """The server closed the connection before the first byte of an answer (a crash, or an idle close)."""


class NotSent(ProtocolError):
    """The connection failed while the request was written: the server has not read it whole."""


class ConnectFailed(OSError):
    """No connection was made (refused, unreachable, timed out, TLS handshake failed): nothing was sent."""


@dataclass
class Exchange:
    status: int
    body: bytes       # at most the cap
    complete: bool    # False: the body went on past the cap and was cut off there
    reusable: bool    # read to its exact end, keep-alive: the connection may serve another request
    headers: list[tuple[bytes, bytes]] | None = None  # the answer's, as sent; None unless asked for


class Connection:
    """A socket, when its last answer ended, whether it has served one before this request, and the
    read timeout set on it."""

    __slots__ = ("sock", "idle_since", "reused", "timeout")

    def __init__(self, sock: socket.socket, timeout: float | None = None):
        self.sock, self.idle_since, self.reused, self.timeout = sock, 0.0, False, timeout

    def wait_at_most(self, timeout: float) -> None:
        """Each read and write of this request waits at most `timeout` (a system call only on a change)."""
        if timeout != self.timeout:
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def dropped(self) -> bool:
        """Closed, reset or written to by the server while idle: not to be used again."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Pool:
    """Keep-alive connections to one origin, last in first out, at most `size` idle ones kept, each
    for at most `keepalive` seconds."""

    def __init__(self, scheme: str, host: str, port: int, size: int, connect_timeout: float,
                 read_timeout: float, keepalive: float, tls: ssl.SSLContext | None = None):
        self.host, self.port, self.size, self.keepalive = host, port, size, keepalive
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._tls = tls if scheme == "https" else None
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self.host_header = host if ":" not in host else f"[{host}]"
        if port != (443 if scheme == "https" else 80):
            self.host_header += f":{port}"

    def get(self, connect_timeout: float | None = None, read_timeout: float | None = None) -> Connection:
        """An idle connection still fresh and open, else a new one (`ConnectFailed` if none is made); its
        reads wait at most `read_timeout` (the pool's own timeouts where not given)."""
        while True:
            stale: list[Connection] = []
            with self._lock:
                conn = self._idle.pop() if self._idle else None
                if conn is not None and time.monotonic() - conn.idle_since > self.keepalive:
                    stale, self._idle = [conn, *self._idle], []  # the newest too old: all are
                    conn = None
            for old in stale:
                old.close()
            if conn is None:
                return self.connect(connect_timeout, read_timeout)
            if not conn.dropped():
                conn.reused = True
                if read_timeout is None:
                    read_timeout = self._read_timeout
                if conn.timeout != read_timeout:  # last set by a request with another
                    conn.wait_at_most(read_timeout)
                return conn
            conn.close()

    def put(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
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

    def connect(self, connect_timeout: float | None = None, read_timeout: float | None = None) -> Connection:
        """A new connection (TCP, then TLS for https), each step within the connect timeout."""
        if connect_timeout is None:
            connect_timeout = self._connect_timeout
        if read_timeout is None:
            read_timeout = self._read_timeout
        try:
            sock = socket.create_connection((self.host, self.port), timeout=connect_timeout)
        except OSError as exc:
            raise ConnectFailed(f"no connection to {self.host}:{self.port}: {_said(exc)}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(read_timeout)
        except OSError as exc:
            sock.close()
            raise ConnectFailed(f"TLS handshake with {self.host}:{self.port} failed: {_said(exc)}") from exc
        except BaseException:
            sock.close()
            raise
        return Connection(sock, read_timeout)


_shared: weakref.WeakValueDictionary[tuple, Pool] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def shared_pool(scheme: str, host: str, port: int, size: int, connect_timeout: float, read_timeout: float,
                keepalive: float, tls: ssl.SSLContext | None) -> Pool:
    """The process's one pool for an origin (scheme, host, port) under this keep-alive and TLS context:
    `/generate` and the reads to a server share its idle connections. It lives while a client holds it
    (weakly kept here); it keeps the most idle connections any holder asked for. The timeouts are only
    its defaults: each holder gives its own per request (`Pool.get`)."""
    tls = tls if scheme == "https" else None
    key = (scheme, host, port, keepalive, tls)
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None:
            pool = _shared[key] = Pool(scheme, host, port, size, connect_timeout, read_timeout, keepalive, tls)
        elif pool.size < size:
            pool.size = size
    return pool


def _said(exc: OSError) -> str:
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__


def request_head(pool: Pool, path: str, headers: Mapping[str, str], length: int, method: str = "POST") -> bytes:
    """The request's head: `method` (POST by default), `path` with its query, `Host`, the body's length
    (none for a GET or HEAD without a body), `Accept-Encoding: identity`, then `headers`."""
    if length or method not in ("GET", "HEAD"):
        lines = [f"{method} {path} HTTP/1.1", f"Host: {pool.host_header}", f"Content-Length: {length}",
                 "Accept-Encoding: identity", *(f"{k}: {v}" for k, v in headers.items())]
    else:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {pool.host_header}", "Accept-Encoding: identity",
                 *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def send_request(conn: Connection, data: bytes) -> None:
    """Write the whole request; `NotSent` if the connection fails on the way (a timeout stays one)."""
    try:
        conn.sock.sendall(data)
    except TimeoutError:
        raise
    except OSError as exc:
        raise NotSent(f"the connection failed while the request was sent ({_said(exc)})") from exc


class DeadlinePassed(Exception):
    """The whole exchange's deadline passed between two reads; `size`: body bytes read so far."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


class _Answer:
    """llhttp's callbacks for one answer: its status, its body's pieces, whether it ended."""

    __slots__ = ("parser", "status", "pieces", "size", "head_done", "framed", "done", "keep", "after")

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.status, self.pieces, self.size = 0, [], 0
        self.head_done = self.framed = self.done = self.keep = self.after = False

    def on_message_begin(self) -> None:
        if self.done:  # a second message: bytes past the answer's end
            self.after = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done and name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.head_done, self.status = True, self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.done:
            self.pieces.append(body)
            self.size += len(body)

    def on_message_complete(self) -> None:
        if self.done:
            return
        if 100 <= self.status < 200:  # interim (100 Continue, 103 Early Hints): the answer follows
            self.head_done = self.framed = False
            self.pieces, self.size = [], 0
            self.interim()
            return
        self.done, self.keep = True, self.parser.should_keep_alive()

    def interim(self) -> None:
        pass


class _Headed(_Answer):
    """An answer whose headers are kept (the final answer's; an interim answer's are dropped)."""

    __slots__ = ("headers",)

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[tuple[bytes, bytes]] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:
            self.headers.append((name, value))
            if name.lower() in (b"content-length", b"transfer-encoding"):
                self.framed = True

    def interim(self) -> None:
        self.headers = []


def read_answer(conn: Connection, deadline: float, max_bytes: int, headers: bool = False) -> Exchange:
    """The answer to the request just sent: its head, then its body up to `max_bytes`; its headers
    too, where asked for. Raises `TimeoutError` (a read outlasted the read timeout), `NoAnswer`,
    `ProtocolError`, `OSError`, or `DeadlinePassed` (between reads, past `deadline`)."""
    answer = _Headed() if headers else _Answer()
    parser = answer.parser = httptools.HttpResponseParser(answer)
    read = 0
    try:
        while not answer.done:
            chunk = _recv(conn, deadline, answer.size, read)
            if not chunk:
                if not read:
                    raise NoAnswer("the server closed the connection before any answer")
                if answer.head_done and not answer.framed:  # framed by the end of the stream
                    return Exchange(answer.status, b"".join(answer.pieces), True, False, _kept(answer))
                raise ProtocolError("the server closed the connection before the answer's end")
            if not answer.head_done and read + len(chunk) > MAX_HEAD:  # the head's bytes bounded, however split
                room = MAX_HEAD - read
                _feed(parser, answer, chunk[:room])
                if not answer.head_done:
                    raise ProtocolError(f"answer head longer than {MAX_HEAD} bytes")
                chunk = chunk[room:]
                read += room
            read += len(chunk)
            _feed(parser, answer, chunk)
            if answer.size > max_bytes:
                return Exchange(answer.status, b"".join(answer.pieces)[:max_bytes], False, False, _kept(answer))
    finally:
        answer.parser = None  # no cycle left for the collector
    body = b"".join(answer.pieces) if len(answer.pieces) != 1 else answer.pieces[0]
    if headers:
        return Exchange(answer.status, body, True, answer.keep and not answer.after, answer.headers)
    return Exchange(answer.status, body, True, answer.keep and not answer.after)


def _kept(answer: _Answer) -> list[tuple[bytes, bytes]] | None:
    return answer.headers if isinstance(answer, _Headed) else None


def _feed(parser: httptools.HttpResponseParser, answer: _Answer, chunk: bytes) -> None:
    try:
        parser.feed_data(chunk)
    except httptools.HttpParserUpgrade:
        raise ProtocolError(f"the server switched protocols (HTTP {answer.status})") from None
    except httptools.HttpParserError as exc:
        if not answer.done:
            raise ProtocolError(f"malformed answer: {exc}") from None
        answer.after = True  # the answer was whole; what followed it was not HTTP


def _recv(conn: Connection, deadline: float, size: int, read: int) -> bytes:
    if time.monotonic() > deadline:
        raise DeadlinePassed(size)
    try:
        return conn.sock.recv(CHUNK)
    except ConnectionResetError as exc:
        if read:
            raise
        raise NoAnswer(f"the server reset the connection before any answer ({exc})") from exc


class Watched(Protocol):
    """A request's deadline watch (`deadlines.Watch`): armed on the socket, disarmed after."""

    fired: bool

    def arm(self, sock: socket.socket) -> None: ...

    def disarm(self) -> bool: ...


def exchange(pool: Pool, watch: Watched, request: bytes, deadline: float, max_bytes: int, connect_timeout: float,
             read_timeout: float, headers: bool = False) -> Exchange:
    """`request` (head and body) on a pooled connection, its answer read under the cap and the deadline;
    if that connection was reused and failed before a byte of answer (the server closed it while idle),
    once more on a fresh one within the same deadline: the server never saw the first; where no fresh
    connection can be made, the first failure is raised (the server went away: a crash drops its
    connections, then closes its port). Raises what
    `Pool.get`, `send_request` and `read_answer` raise; `watch.fired` then says whether the watchdog
    (the deadline, or a cut) ended it."""
    conn = pool.get(connect_timeout, read_timeout)
    try:
        return _once(pool, conn, watch, request, deadline, max_bytes, headers)
    except (NotSent, NoAnswer) as failed:
        if not conn.reused or watch.fired:
            raise
        first = failed
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlinePassed(0)
    try:
        fresh = pool.connect(min(connect_timeout, left), read_timeout)
    except ConnectFailed:
        # No fresh connection: the first one met the server going away (a crash closes every connection,
        # then the port), not an idle close: that drop is what the caller must see (a crash is noted by it).
        raise first from None
    return _once(pool, fresh, watch, request, deadline, max_bytes, headers)


def _once(pool: Pool, conn: Connection, watch: Watched, request: bytes, deadline: float, max_bytes: int,
          headers: bool) -> Exchange:
    reusable = False
    try:
        watch.arm(conn.sock)  # from here the watchdog bounds the exchange
        send_request(conn, request)
        answer = read_answer(conn, deadline, max_bytes, headers)
        reusable = answer.reusable
        return answer
    finally:
        if watch.disarm() and reusable:
            pool.put(conn)
        else:
            conn.close()  # never pool a connection cut off, or with unread bytes
