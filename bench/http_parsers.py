"""Which HTTP/1.1 parser reads `/generate`'s answers: CPU per request, llhttp (httptools) vs h11.

The worker's call (`workers/servers/sglang_client.send`) keeps its own pool of
keep-alive sockets and its deadline watchdog; only the parsing of the answer
is a library's. Two candidates, the same scaffolding around each (a pooled
connection from `http1.Pool`, the watchdog armed on its socket, the request
written whole, the answer read under the size cap, the connection pooled
again when the answer allows it):

  parse-httptools  the request head written by hand, the answer parsed by llhttp
                   (`httptools.HttpResponseParser`): the worker's `http1.read_answer`
  parse-h11        the request written and the answer parsed by `h11`'s state
                   machine (it must send the request to accept an answer)

beside `worker`, the worker's whole call (retry of a stale connection, the
error mapping). Each runs in a child of `bench.http_clients` (N threads posting
the worker's `/generate` body in a loop against an instant stand-in; the
child's own CPU over a steady-state window), so the figures are CPU
microseconds per request, comparable within one run only.

`python -m bench --parts http` (`bench/http_cpu.py`: each candidate's CPU per
request at 16 and 256 in flight, and h11's / llhttp's), or
`python -m bench.http_clients --clients worker,parse-httptools,parse-h11`.
"""
from __future__ import annotations

import time


def make_parser_candidate(name: str, n: int, connect_timeout: float, read_timeout: float, deadline_s: float):
    """post(url, body) -> (status, raw bytes), the worker's pool and watchdog around `name`'s parser."""
    from workers.servers import http1
    from workers.servers.deadlines import Watch
    from workers.servers.sglang_client import _WATCHDOG, make_client

    client = make_client(n, connect_timeout, read_timeout, None)
    exchange = _httptools_exchange if name == "parse-httptools" else _h11_exchange

    def post(url: str, body: bytes):
        pool, path, headers = client.route(url)
        deadline = time.monotonic() + deadline_s
        watch, conn, reusable = Watch(_WATCHDOG, deadline), pool.get(), False
        try:
            watch.arm(conn.sock)
            status, raw, reusable = exchange(http1, pool, conn, path, headers, body, deadline)
            return status, raw
        finally:
            if watch.disarm() and reusable:
                pool.put(conn)
            else:
                conn.close()
    return post


def _httptools_exchange(http1, pool, conn, path, headers, body, deadline):
    http1.send_request(conn, http1.request_head(pool, path, headers, len(body)) + body)
    answer = http1.read_answer(conn, deadline, 1 << 24)
    return answer.status, answer.body, answer.reusable


def _h11_exchange(http1, pool, conn, path, headers, body, deadline):
    import h11
    machine = h11.Connection(h11.CLIENT, max_incomplete_event_size=http1.MAX_HEAD)
    fields = [("Host", pool.host_header), ("Content-Length", str(len(body))), ("Accept-Encoding", "identity"),
              *headers.items()]
    conn.sock.sendall(machine.send(h11.Request(method="POST", target=path, headers=fields))
                      + machine.send(h11.Data(data=body)) + machine.send(h11.EndOfMessage()))
    status, pieces, size = 0, [], 0
    while True:
        event = machine.next_event()
        if event is h11.NEED_DATA:
            if time.monotonic() > deadline:
                raise http1.DeadlinePassed(size)
            machine.receive_data(conn.sock.recv(http1.CHUNK))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            pieces.append(event.data)
            size += len(event.data)
            if size > 1 << 24:
                return status, b"".join(pieces), False
        elif isinstance(event, h11.EndOfMessage):
            return status, b"".join(pieces), machine.their_state is h11.DONE and machine.our_state is h11.DONE \
                and not machine.trailing_data[0]
        elif isinstance(event, h11.ConnectionClosed):
            raise http1.ProtocolError("closed before the answer's end")
