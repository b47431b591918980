"""The health, preflight, tokenizer-probe, load and crash reads go through `/generate`'s own HTTP stack.

Given a server, then a health read and a `/generate` to it share one pool
(`http1.shared_pool`, per origin and keep-alive) and the worker's one TLS
context: over TLS, one handshake serves both; a read's short timeout is the
read's, never left on the connection a `/generate` takes up next. A read is a GET without a body
(or a small POST), its auth header sent, the answer's headers kept for httpx
(`response.json()`, its `Content-Type`). Its failures are httpx's, as the
callers catch them: a malformed answer is `httpx.RemoteProtocolError` (the
health monitor then marks the server down, never an unexpected exception), a
refused connection `httpx.ConnectError`, a close with no answer
`httpx.ReadError` (after one more try on a fresh connection where the first
was a reused one the server had closed while idle), an answer past the cap
`reads.AnswerTooLong`.
"""
from __future__ import annotations

import json
import socket
import ssl
import threading
import time

import httpx
import pytest

from contract.names import ServerState
from private_ca import make_ca
from workers.servers import http1, reads, tls
from workers.servers.bindings import ServerPool
from workers.servers.health import HealthMonitor
from workers.servers.sglang_client import make_client, send
from workers.settings import Settings

from .test_generate_call import ANSWER, reply, serve  # noqa: F401  (the scripted server)
from .test_http_answers import MALFORMED, scripted


class TlsServer:
    """A keep-alive HTTPS loopback server, signed by a private CA, that counts its TLS handshakes and
    answers `/generate` with ANSWER and any other path with `{"ok": true}`."""

    def __init__(self, tmp_path):
        self.ca = make_ca(tmp_path / "ca")
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(self.ca.cert, self.ca.key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://localhost:{self.listener.getsockname()[1]}"
        self.handshakes = 0
        self.heads: list[bytes] = []
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            conn = self._context.wrap_socket(raw, server_side=True)
            self.handshakes += 1
            self._open.append(conn)
            reader = conn.makefile("rb")
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                self.heads.append(head)
                length = next((int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                               if k.lower() == b"content-length"), 0)
                reader.read(length)
                reply(conn, ANSWER if head.startswith(b"POST /generate ") else b'{"ok": true}')
        except OSError:
            return

    def close(self) -> None:
        self.listener.close()
        for conn in self._open:
            conn.close()


@pytest.fixture
def tls_server(tmp_path, monkeypatch):
    server = TlsServer(tmp_path)
    # the worker's one context, trusting the private CA (as SSL_CERT_FILE would make it in a worker)
    monkeypatch.setattr(tls, "_context", ssl.create_default_context(cafile=str(server.ca.ca)))
    yield server
    server.close()


def test_a_health_read_and_a_generate_to_one_server_share_its_pool_and_its_tls_handshake(tls_server):
    # Given the health monitor's client and the /generate client of one worker
    transport = reads.Transport(5.0, http1.KEEPALIVE)
    health = httpx.Client(transport=transport, timeout=5.0)
    generate = make_client(4, connect_timeout=5, request_timeout=30, api_key=None)

    # When a health read, a /generate and another health read go to one server over TLS
    assert health.get(f"{tls_server.url}/health").status_code == 200
    reply_ = send(generate, f"{tls_server.url}/generate", b"{}", timeout=10.0, max_bytes=1 << 20)
    again = health.get(f"{tls_server.url}/health")

    # Then they share one pool and one TLS context: one handshake served all three
    assert (reply_.status, reply_.body) == (200, ANSWER) and again.json() == {"ok": True}
    assert transport.pool("https", "localhost", int(tls_server.url.rsplit(":", 1)[1])) is \
        generate.route(f"{tls_server.url}/generate")[0]
    assert tls_server.handshakes == 1
    assert [h.split(b" ")[:2] for h in tls_server.heads] == [[b"GET", b"/health"], [b"POST", b"/generate"],
                                                            [b"GET", b"/health"]]


def test_a_read_is_a_get_with_its_auth_and_its_answer_headers_kept(serve):
    server = serve(lambda conn, _: reply(conn, b'{"running": 1}'))
    client = reads.deadline_client(5.0, {"Authorization": "Bearer k"})

    response = client.get(f"{server.url}/v1/loads?include=all")

    assert response.json() == {"running": 1}
    assert response.headers["content-type"] == "application/json"
    head = server.heads[0].decode()
    assert head.startswith("GET /v1/loads?include=all HTTP/1.1\r\n")
    assert "Authorization: Bearer k\r\n" in head and "Content-Length" not in head
    assert head.count("Host:") == 1 and head.lower().count("accept-encoding") == 1


def test_a_read_posts_a_json_body(serve):
    server = serve(lambda conn, _: reply(conn, b'{"tokens": [[1]]}'))
    response = reads.deadline_client(5.0, {}).post(f"{server.url}/tokenize", json={"prompt": ["a"]})
    assert response.json() == {"tokens": [[1]]}
    head = server.heads[0].decode()
    body = json.dumps({"prompt": ["a"]}, separators=(",", ":")).encode()
    assert head.startswith("POST /tokenize HTTP/1.1\r\n") and f"Content-Length: {len(body)}\r\n" in head


@pytest.mark.parametrize("data", [MALFORMED[k] for k in ("negative Content-Length", "a chunk size in 0x hex",
                                                         "not HTTP at all", "a non-ASCII digit in the status")],
                         ids=["negative Content-Length", "0x chunk size", "not HTTP", "non-ASCII status"])
def test_a_malformed_answer_to_a_read_is_httpxs_protocol_error(serve, data):
    server = serve(scripted(data))
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        reads.deadline_client(5.0, {}).get(f"{server.url}/health")
    assert isinstance(caught.value.__cause__, http1.ProtocolError)


def test_a_malformed_answer_to_the_health_probe_marks_the_server_down_not_an_unexpected_error(serve):
    # Given a server that answers every request with a malformed Content-Length
    server = serve(scripted(MALFORMED["negative Content-Length"]))
    settings = Settings(sglang_urls=server.url, health_timeout=2.0, health_failures=1)
    pool = ServerPool([server.url], 4)
    monitor = HealthMonitor(pool, settings, {})
    binding = pool.bindings[0]

    # When the monitor checks it, then the server is down for its protocol error, and the check returned
    monitor.check(binding)
    assert binding.state == ServerState.DOWN
    assert "RemoteProtocolError" in binding.last_error and not binding.usable


def test_a_refused_connection_is_a_connect_error_and_a_close_without_answer_a_read_error(serve):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(httpx.ConnectError):
        reads.deadline_client(5.0, {}).get(f"http://127.0.0.1:{port}/health")

    server = serve(lambda conn, _: conn.shutdown(socket.SHUT_RDWR))
    with pytest.raises(httpx.ReadError):
        reads.deadline_client(5.0, {}).get(f"{server.url}/health")


def test_a_reused_connection_the_server_closed_as_a_read_went_out_is_read_again_on_a_fresh_one(serve):
    served: dict[int, int] = {}

    def behave(conn: socket.socket, _) -> None:  # the first request on a connection answered, the next dropped
        served[conn.fileno()] = served.get(conn.fileno(), 0) + 1
        if served[conn.fileno()] == 1:
            reply(conn, b"{}")
        else:
            conn.shutdown(socket.SHUT_RDWR)
    server = serve(behave)
    client = reads.deadline_client(5.0, {})
    assert client.get(f"{server.url}/health").status_code == 200
    assert client.get(f"{server.url}/health").status_code == 200
    assert server.connections == 2


def test_an_answer_past_the_reads_cap_is_refused(serve):
    server = serve(lambda conn, _: reply(conn, b"x" * 5000))
    client = httpx.Client(transport=reads.Transport(5.0, http1.KEEPALIVE, max_bytes=1024))
    with pytest.raises(reads.AnswerTooLong):
        client.get(f"{server.url}/server_info")


def test_a_reads_short_timeout_stays_with_the_read_not_with_the_connection_generate_reuses(serve):
    # Given a server that answers reads at once and takes 1.5 s over a /generate
    def behave(conn: socket.socket, head: bytes) -> None:
        if head.startswith(b"POST /generate "):
            time.sleep(1.5)
        reply(conn)
    server = serve(behave)
    health = reads.deadline_client(1.0, {})
    generate = make_client(4, connect_timeout=5, request_timeout=30, api_key=None)

    # When a read with a 1 s deadline leaves its connection idle and a /generate takes it up
    assert health.get(f"{server.url}/health").status_code == 200
    answer = send(generate, f"{server.url}/generate", b"{}", timeout=10.0, max_bytes=1 << 20)

    # Then the /generate waits with its own timeout on that same connection, and is answered
    assert (answer.status, answer.body) == (200, ANSWER)
    assert server.connections == 1
