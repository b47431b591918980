"""What the worker makes of a server's HTTP/1.1 answer, however it is framed or malformed.

Given a loopback server that answers each `/generate` with scripted bytes and
then keeps the connection open, then every malformed answer in the corpus
ends the call at once as the server's failure (`ServerUnavailable`, whose
cause is the parser's `ProtocolError`): never a hang until the deadline,
never another exception type, never a body taken as complete. Well-formed
edge cases (no body for 204/304, interim 100s, chunked with extensions and a
trailer, keep-alive reuse, `Connection: close`, a body framed by the end of
the stream) are read exactly, and a connection is used again only when its
answer allowed it. The size cap holds while reading: a chunk or a length far
past the cap is cut at the cap as soon as it is passed, not waited for.

Connections: a server that cannot be reached within the connect timeout (a
black hole) is `ServerUnavailable`, as a refused one, never `TransientError`;
a reused connection the server closed as the request went out is sent again
once on a fresh connection, unseen by the caller. A TLS socket shut by the
watchdog raises an `OSError`, never `ValueError`.
"""
from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from private_ca import make_ca
from workers.servers import http1
from workers.servers.deadlines import DeadlineWatchdog
from workers.servers.sglang_client import ServerDropped, ServerUnavailable, TransientError, make_client, send

from .test_generate_call import ANSWER, Scripted, call, client, reply, serve  # noqa: F401  (the scripted server)

CL = b"Content-Length: %d\r\n" % len(ANSWER)
OK = b"HTTP/1.1 200 OK\r\n"

MALFORMED = {
    "negative Content-Length": OK + b"Content-Length: -3\r\n\r\n" + ANSWER,
    "signed Content-Length": OK + b"Content-Length: +5\r\n\r\n" + ANSWER,
    "Content-Length with an underscore": OK + b"Content-Length: 1_0\r\n\r\n" + ANSWER,
    "Content-Length in hex": OK + b"Content-Length: 0x10\r\n\r\n" + ANSWER,
    "Content-Length of non-ASCII digits": OK + "Content-Length: ١٠\r\n\r\n".encode() + ANSWER,
    "two different Content-Lengths": OK + b"Content-Length: 5\r\nContent-Length: 9\r\n\r\n" + ANSWER,
    "a Content-Length list": OK + b"Content-Length: 5, 9\r\n\r\n" + ANSWER,
    "a Content-Length past 2**64": OK + b"Content-Length: 99999999999999999999999\r\n\r\n",
    "Content-Length beside chunked": OK + CL + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "a chunk size in 0x hex": OK + b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    "a negative chunk size": OK + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
    "a chunk size that is not hex": OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    "a chunk size past 2**64": OK + b"Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n",
    "no CRLF after a chunk's data": OK + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    "a non-ASCII digit in the status": "HTTP/1.1 2٠0 OK\r\n".encode() + CL + b"\r\n" + ANSWER,
    "a status that is not a number": b"HTTP/1.1 abc OK\r\n" + CL + b"\r\n" + ANSWER,
    "no status": b"HTTP/1.1\r\n" + CL + b"\r\n" + ANSWER,
    "not HTTP at all": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "bare LF line ends": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
    "a header without a colon": OK + b"Content-Length 2\r\n\r\nhi",
    "a folded header": OK + b"X-A: a\r\n b\r\n" + CL + b"\r\n" + ANSWER,
    "switching protocols": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
    "a head past 64 KiB": OK + b"X-Pad: " + b"a" * 70_000 + b"\r\n" + CL + b"\r\n" + ANSWER,
}


def scripted(data: bytes):
    """Answer every request with `data` and keep the connection open (a parser that waits hangs)."""
    def behave(conn: socket.socket, _) -> None:
        conn.sendall(data)
    return behave


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_answer_is_the_servers_failure_at_once(serve, data):
    # Given a server that answers with malformed bytes and keeps the connection open
    server = serve(scripted(data))

    # When the worker calls it, with 10 s to go
    started = time.monotonic()
    with pytest.raises(ServerUnavailable) as caught:
        call(client(), server.url, timeout=10.0)

    # Then the call ends at once, as a protocol error of the parser's, never another exception type
    assert time.monotonic() - started < 2.0
    assert isinstance(caught.value.__cause__, http1.ProtocolError), repr(caught.value.__cause__)


def test_an_answer_cut_off_mid_chunk_is_the_servers_failure(serve):
    def behave(conn: socket.socket, _) -> None:
        conn.sendall(OK + b"Transfer-Encoding: chunked\r\n\r\n100\r\n" + b"x" * 10)
        conn.shutdown(socket.SHUT_RDWR)
    with pytest.raises(ServerUnavailable, match="before the answer's end"):
        call(client(), serve(behave).url)


EMPTY = {
    "204 without a length": b"HTTP/1.1 204 No Content\r\n\r\n",
    "304 without a length": b"HTTP/1.1 304 Not Modified\r\n\r\n",
    "204 after an interim 100": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
}


@pytest.mark.parametrize("data", EMPTY.values(), ids=EMPTY.keys())
def test_an_answer_without_a_body_is_read_at_once_and_its_connection_kept(serve, data):
    # Given a server whose answer has no body by its status, and which keeps the connection open
    server = serve(scripted(data))
    c = client()

    # When the worker calls it twice
    started = time.monotonic()
    first, second = call(c, server.url), call(c, server.url)

    # Then each call returns the status with an empty body at once, on the same connection
    assert time.monotonic() - started < 2.0
    assert (first.body, first.complete) == (b"", True) and second == first
    assert server.connections == 1


KEPT = {
    "Content-Length": (OK + CL + b"\r\n" + ANSWER, True),
    "chunked, extensions and a trailer": (OK + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in (ANSWER[:7], ANSWER[7:])) + b"0\r\nX-T: 1\r\n\r\n", True),
    "interim 100 first": (b"HTTP/1.1 100 Continue\r\n\r\n" + OK + CL + b"\r\n" + ANSWER, True),
    "Connection: close": (OK + b"Connection: close\r\n" + CL + b"\r\n" + ANSWER, False),
    "HTTP/1.0": (b"HTTP/1.0 200 OK\r\n" + CL + b"\r\n" + ANSWER, False),
    "bytes past the answer's end": (OK + CL + b"\r\n" + ANSWER + b"HTTP/1.1 200 OK\r\n", False),
}


@pytest.mark.parametrize("data, kept", KEPT.values(), ids=KEPT.keys())
def test_a_well_formed_answer_is_read_whole_and_its_connection_kept_only_when_it_allows(serve, data, kept):
    # Given a server that answers well, framed one way or another
    server = serve(scripted(data))
    c = client()

    # When the worker calls it twice
    first, second = call(c, server.url), call(c, server.url)

    # Then both are read whole, on one connection only where the answer allowed it to be kept
    assert (first.status, first.body, first.complete) == (200, ANSWER, True) and second == first
    assert server.connections == (1 if kept else 2)


def test_a_body_framed_by_the_end_of_the_stream_is_read_to_it(serve):
    def behave(conn: socket.socket, _) -> None:
        conn.sendall(OK + b"\r\n" + ANSWER)
        conn.shutdown(socket.SHUT_WR)
    answer = call(client(), serve(behave).url)
    assert (answer.status, answer.body, answer.complete) == (200, ANSWER, True)


BIG = {
    "an 8 MiB chunk": OK + b"Transfer-Encoding: chunked\r\n\r\n800000\r\n" + b"x" * 4096,
    "an 8 MiB Content-Length": OK + b"Content-Length: 8388608\r\n\r\n" + b"x" * 4096,
}


@pytest.mark.parametrize("data", BIG.values(), ids=BIG.keys())
def test_the_cap_holds_while_reading_a_body_that_claims_more(serve, data):
    # Given a server that announces 8 MiB, sends 4 KiB of it and then waits
    server = serve(scripted(data))

    # When the worker calls it with a 1 KiB cap, then it gets the first 1 KiB at once, marked incomplete
    started = time.monotonic()
    cut = call(client(), server.url, timeout=10.0, max_bytes=1024)
    assert time.monotonic() - started < 2.0
    assert (cut.status, cut.body, cut.complete) == (200, b"x" * 1024, False)


def test_a_server_whose_host_does_not_answer_connects_is_unavailable_not_a_transient_failure():
    # Given a listener whose backlog is full, so that a new connection's SYN goes unanswered (a black hole)
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    fillers = []
    for _ in range(8):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(hole.getsockname())
        fillers.append(s)
    time.sleep(0.2)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    c = make_client(4, connect_timeout=0.5, request_timeout=30, api_key=None)
    try:
        # When the worker calls it, then the call ends within the connect timeout as the server's outage
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="no connection") as caught:
            send(c, f"{url}/generate", b"{}", timeout=10.0, max_bytes=1 << 20)
        assert not isinstance(caught.value, TransientError)
        assert time.monotonic() - started < 5.0
    finally:
        for s in fillers:
            s.close()
        hole.close()


def test_a_reused_connection_closed_as_the_request_went_out_is_sent_again_on_a_fresh_one(serve):
    # Given a server that answers its first request on each connection and closes the connection,
    # without an answer, on the next one (as a server whose idle timer fired as the request came)
    served: dict[int, int] = {}

    def behave(conn: socket.socket, _) -> None:
        served[conn.fileno()] = served.get(conn.fileno(), 0) + 1
        if served[conn.fileno()] == 1:
            reply(conn)
        else:
            conn.shutdown(socket.SHUT_RDWR)
    server = serve(behave)
    c = client()
    call(c, server.url)

    # When the next call goes out on the kept connection, then it is answered, on a second connection
    assert call(c, server.url).body == ANSWER
    assert server.connections == 2


def test_a_reused_connection_dropped_by_a_server_that_then_refuses_connections_is_its_drop(serve):
    # Given a server that answers its first request, then takes the next one on the kept connection and
    # goes away: its listener closed (no new connection is accepted), that connection closed unanswered
    # (a crash of its engine)
    holder: list = []

    def behave(conn: socket.socket, _) -> None:
        if holder:
            holder[0].listener.shutdown(socket.SHUT_RDWR)  # the port closes
            holder[0].close()
            conn.shutdown(socket.SHUT_RDWR)
        else:
            holder.append(server)
            reply(conn)
    server = serve(behave)
    c = client()
    call(c, server.url)

    # When the next call goes out on the kept connection, then it is the server's drop (a crash is noted by
    # it), not a refused fresh connection, and never sent a second time
    with pytest.raises(ServerDropped):
        call(c, server.url)
    assert server.connections == 1


def test_a_connection_idle_past_the_keepalive_is_not_used_again(serve):
    server = serve(scripted(OK + CL + b"\r\n" + ANSWER))
    c = make_client(4, connect_timeout=5, request_timeout=30, api_key=None, keepalive=0.2)
    call(c, server.url)
    call(c, server.url)
    time.sleep(0.4)
    call(c, server.url)
    assert server.connections == 2


@pytest.fixture
def tls_server(tmp_path):
    """A TLS loopback server signed by a private CA that sends an answer's head and then nothing."""
    ca = make_ca(tmp_path / "ca")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.cert, ca.key)
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve_one() -> None:
        raw, _ = listener.accept()
        conn = context.wrap_socket(raw, server_side=True)
        conn.recv(65536)
        conn.sendall(OK + b"Content-Length: 1000\r\n\r\n{")
        held.append(conn)  # open, silent
    threading.Thread(target=serve_one, daemon=True).start()
    yield ca, listener.getsockname()[1]
    listener.close()
    for conn in held:
        conn.close()


def test_the_watchdog_ends_a_tls_read_with_an_os_error_never_a_value_error(tls_server):
    # Given a TLS connection, trusted through its private CA, waiting on a server that went silent mid-answer
    ca, port = tls_server
    trust = ssl.create_default_context(cafile=str(ca.ca))
    pool = http1.Pool("https", "localhost", port, 2, 5.0, 30.0, 4.0, trust)
    conn = pool.connect()
    dog = DeadlineWatchdog(tick=0.05)
    key = dog.arm(conn.sock, time.monotonic() + 0.5)
    http1.send_request(conn, http1.request_head(pool, "/generate", {}, 2) + b"{}")

    # When the watchdog shuts its socket at the deadline, then the read ends with an OSError
    started = time.monotonic()
    with pytest.raises(OSError):
        http1.read_answer(conn, time.monotonic() + 30, 1 << 20)
    assert time.monotonic() - started < 3.0
    assert dog.disarm(key) is False
    conn.close()
