"""The one HTTP call to `/generate` (`workers/servers/sglang_client.send`) against a scripted loopback server.

Given a server that answers well, then the answer is read whole and its connection
is kept for the next call. Given a server that goes silent (before or after its
head) or trickles bytes, then the call ends with the deadline's `TransientError`
long before the client's read timeout (30 s here) could end it. Given an answer
past the size cap, then the call returns what fits, marked incomplete, and never
reuses that connection. A server that cuts the answer off or is not there is
`ServerUnavailable`. Credentials in a server's URL go to that server only, as
Basic auth; the others get the API key's bearer header. A call waiting on a
server that the health monitor marks down is cut at once (`ServerCut`), and
only the calls to that server. The health monitor's own client ends each call
(head, or a body that trickles forever) within its whole-call timeout.
"""
from __future__ import annotations

import base64
import json
import socket
import threading
import time

import pytest

from contract.redis_link.connections import redact_url
import httpx

from workers.servers.deadlines import DeadlineWatchdog, Watch
from workers.servers.reads import deadline_client
from workers.servers.sglang_client import ServerCut, ServerUnavailable, TransientError, make_client, send

READ_TIMEOUT = 30.0  # far beyond every deadline below: only the watchdog can end those calls early
ANSWER = json.dumps({"output_ids": [1, 2, 3], "meta_info": {}}).encode()


class Scripted:
    """A loopback HTTP/1.1 server; `behave(conn, request_head)` answers each request."""

    def __init__(self, behave):
        self.behave = behave
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.heads: list[bytes] = []
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self.open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = int(next((v for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                                   if k.lower() == b"content-length"), b"0"))
                reader.read(length)
                self.heads.append(head)
                self.behave(conn, head)
        except OSError:
            return

    def close(self) -> None:
        self.listener.close()
        for conn in self.open:
            conn.close()


def reply(conn: socket.socket, body: bytes = ANSWER, status: str = "200 OK") -> None:
    conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def answer(conn: socket.socket, _) -> None:
    reply(conn)


def head_then_silence(conn: socket.socket, _) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{")
    time.sleep(3600)


def trickle(conn: socket.socket, _) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    while True:
        conn.sendall(b" ")
        time.sleep(0.05)


def cut_off(conn: socket.socket, _) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"output_ids\"")
    conn.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def serve():
    servers: list[Scripted] = []

    def start(behave) -> Scripted:
        servers.append(Scripted(behave))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def client(urls=(), api_key=None):
    return make_client(4, connect_timeout=5, request_timeout=READ_TIMEOUT, api_key=api_key, server_urls=list(urls))


def call(c, url, timeout=10.0, max_bytes=1 << 20):
    return send(c, f"{url}/generate", b"{}", timeout=timeout, max_bytes=max_bytes)


def test_an_answer_is_read_whole_and_its_connection_kept_for_the_next_call(serve):
    server = serve(answer)
    c = client()
    first, second = call(c, server.url), call(c, server.url)
    assert (first.status, first.body, first.complete) == (200, ANSWER, True)
    assert second == first
    assert server.connections == 1


@pytest.mark.parametrize("behave", [head_then_silence, trickle, lambda conn, head: time.sleep(3600)],
                         ids=["silent after its head", "trickling", "silent before its head"])
def test_a_server_that_holds_the_answer_is_cut_at_the_calls_deadline(serve, behave):
    server = serve(behave)
    with pytest.raises(TransientError, match=r"no complete answer within 1s"):
        call(client(), server.url, timeout=1.0)


def chunked(conn: socket.socket, _) -> None:
    """The answer in three chunks, then the last chunk with a trailer (a proxy's way)."""
    parts = [ANSWER[:5], ANSWER[5:20], ANSWER[20:]]
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-Trailer: 1\r\n\r\n")


def then_close(conn: socket.socket, _) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
    conn.close()


def old_http(conn: socket.socket, _) -> None:
    """HTTP/1.0 with no length, after an interim 100 answer: the body ends where the stream does."""
    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\n" + ANSWER)
    conn.close()


@pytest.mark.parametrize("behave, kept", [(chunked, True), (then_close, False), (old_http, False)],
                         ids=["chunked", "Connection: close", "HTTP/1.0 to the end of the stream"])
def test_an_answer_framed_any_way_http_allows_is_read_whole(serve, behave, kept):
    server = serve(behave)
    c = client()
    first, second = call(c, server.url), call(c, server.url)
    assert (first.status, first.body, first.complete) == (200, ANSWER, True)
    assert second == first
    assert server.connections == (1 if kept else 2)


def test_a_kept_connection_the_server_closed_while_idle_is_not_used_again(serve):
    # Given a call whose connection the client kept, which the server then closed
    server = serve(answer)
    c = client()
    call(c, server.url)
    server.open[0].shutdown(socket.SHUT_RDWR)
    time.sleep(0.1)

    # When the next call is made, then it is answered on a new connection, not failed
    assert call(c, server.url).body == ANSWER
    assert server.connections == 2


def test_an_answer_past_the_cap_is_cut_there_and_its_connection_never_reused(serve):
    server = serve(lambda conn, head: reply(conn, b"x" * 300_000))
    c = client()
    cut = call(c, server.url, max_bytes=1000)
    assert (cut.status, len(cut.body), cut.complete) == (200, 1000, False)
    call(c, server.url, max_bytes=1000)
    assert server.connections == 2


def test_an_error_status_is_returned_with_its_body(serve):
    server = serve(lambda conn, head: reply(conn, b'{"error": "queue full"}', "503 Service Unavailable"))
    answer = call(client(), server.url)
    assert (answer.status, answer.body) == (503, b'{"error": "queue full"}')


def test_a_server_that_cuts_its_answer_off_or_is_not_there_is_unavailable(serve):
    server = serve(cut_off)
    with pytest.raises(ServerUnavailable):
        call(client(), server.url)
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(ServerUnavailable):
        call(client(), f"http://127.0.0.1:{port}")


def test_credentials_in_a_url_go_as_basic_auth_to_that_server_only(serve):
    # Given two servers, the first bound by a URL with credentials, and an API key
    with_creds, plain = serve(answer), serve(answer)
    raw = with_creds.url.replace("http://", "http://user:s3cr%2Ft@")
    c = client([raw, plain.url], api_key="sk-key")

    # When each is called by its binding's (redacted) URL
    call(c, redact_url(raw))
    call(c, plain.url)

    # Then the first gets its credentials, the second the bearer key, and no URL carries a user part
    def authorization(head: bytes) -> str:
        return next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                    if line.lower().startswith(b"authorization:"))
    assert authorization(with_creds.heads[0]) == "Basic " + base64.b64encode(b"user:s3cr/t").decode()
    assert authorization(plain.heads[0]) == "Bearer sk-key"
    assert with_creds.heads[0].startswith(b"POST /generate HTTP/1.1\r\n")


def test_the_watchdog_shuts_only_the_sockets_past_their_deadline():
    dog = DeadlineWatchdog(tick=3600)  # its thread never wakes in this test: `fire` is called by hand
    late, on_time = socket.socketpair(), socket.socketpair()
    late_watch, on_time_watch = Watch(dog, deadline=10.0), Watch(dog, deadline=30.0)
    late_watch.arm(late[0])
    on_time_watch.arm(on_time[0])

    assert dog.fire(now=20.0) == 1
    assert late[0].recv(1) == b""  # shut down: a blocked read would return at once
    assert late_watch.disarm() is False and late_watch.disarm() is False
    assert on_time_watch.disarm() is True
    assert dog.fire(now=40.0) == 0
    for pair in (late, on_time):
        for s in pair:
            s.close()


def test_a_call_waiting_on_a_server_marked_down_is_cut_at_once_and_only_there(serve):
    wedged, fine = serve(lambda conn, head: time.sleep(3600)), serve(answer)
    c = client()
    outcome: dict[str, BaseException] = {}

    def waiting() -> None:
        try:
            call(c, wedged.url, timeout=3600)
        except BaseException as exc:  # noqa: BLE001 (the test reads it)
            outcome["error"] = exc

    thread = threading.Thread(target=waiting)
    thread.start()
    while not wedged.heads:  # the request reached the server and waits for its answer
        time.sleep(0.01)
    assert c.cut(fine.url, "down") == 0
    assert c.cut(wedged.url, "/health did not answer in full within 2s") == 1
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome["error"], ServerCut) and "marked down" in str(outcome["error"])
    assert call(c, fine.url).status == 200 and c.cut(wedged.url, "down") == 0


def test_a_watch_cut_before_it_is_armed_shuts_its_socket_when_armed():
    dog = DeadlineWatchdog(tick=3600)
    pair = socket.socketpair()
    watch = Watch(dog, deadline=3600.0)
    watch.cut("down")
    watch.arm(pair[0])
    assert pair[0].recv(1) == b""
    assert watch.disarm() is False
    for s in pair:
        s.close()


def health_like(conn: socket.socket, _) -> None:
    """200's head at once, then a byte every 0.2 s for ever: each read returns well within any timeout."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:
        conn.sendall(b"1\r\n\n\r\n")
        time.sleep(0.2)


def slow_head(conn: socket.socket, _) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
        conn.sendall(bytes([byte]))
        time.sleep(0.2)


@pytest.mark.parametrize("behave", [health_like, slow_head, lambda conn, head: time.sleep(3600)],
                         ids=["body trickling", "head trickling", "silent"])
def test_the_health_client_ends_each_call_within_its_whole_timeout(serve, behave):
    server = serve(behave)
    started = time.monotonic()
    with pytest.raises(httpx.TimeoutException):
        deadline_client(1.0, {}).get(f"{server.url}/health")
    assert time.monotonic() - started < 10.0  # not the for ever the server would hold it
