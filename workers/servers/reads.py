"""The health, preflight, tokenizer-probe, load and crash reads: httpx's client over the worker's HTTP stack.

The callers (`health.py`, `preflight.py`, `gateway_preflight.py`,
`tokenizers.py`, `load.py`, `crashes.py`) keep httpx's client as their
façade: `client.get(url)`, `client.post(url, json=...)`, `response.json()`,
its auth flow (`auth.ServerCredentials`) and its exceptions. Underneath,
`deadline_client`'s transport (`httpx.BaseTransport`, httpx's public API)
sends each request through `/generate`'s own stack (`http1.exchange`): the
same pool per origin (`http1.shared_pool`: a health read and a `/generate`
to one server use one set of keep-alive connections, idle ones dropped after
`FLEET_KEEPALIVE_SECONDS`), the same TLS context (`tls.py`), llhttp's strict
framing, the answer read under a size cap (`MAX_BYTES`), a stale reused
connection tried once more on a fresh one, and the same deadline watchdog.

Every wait of a read ends by its whole deadline, set as it starts (the
client's `whole`, or a request's shorter `timeout=`): connecting within the
time left, each read and write within it, the deadline checked between reads
and the watchdog shutting the socket at it. The answer is read whole before
httpx sees it, so nothing waits after `handle_request` returns.

Our failures are httpx's, as the callers catch them (the cause kept, so
`tls.why_untrusted` finds a failed certificate check):
- no connection made: `httpx.ConnectTimeout` when it timed out (a host that
  does not answer), else `httpx.ConnectError` (refused, unreachable, the TLS
  handshake failed);
- the deadline passed (between reads, a read's timeout, or the watchdog's
  shutdown): `httpx.ReadTimeout`;
- the connection closed before any byte of answer (`http1.NoAnswer`):
  `httpx.ReadError`; it failed while the request was written: `httpx.WriteError`;
- the answer broke HTTP/1.1 or was cut off (`http1.ProtocolError`):
  `httpx.RemoteProtocolError`; any other socket error: `httpx.ReadError`;
- an answer longer than the cap: `AnswerTooLong` (an `httpx.RequestError`,
  neither a network nor a protocol error: it says nothing of the server's
  life).
Every one is an `httpx.HTTPError`: no other exception leaves a read.
"""
from __future__ import annotations

import threading
import time

import httpx

from . import http1, tls
from .auth import Origin
from .deadlines import WATCHDOG, Watch

MAX_BYTES = 16 << 20  # a read's answer (a /server_info, a gateway's /workers, a /tokenize): far below this
POOL_SIZE = 4         # idle connections a read keeps per server (the shared pool keeps /generate's more)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_OURS = {b"host", b"content-length", b"transfer-encoding", b"connection", b"accept-encoding", b"keep-alive"}


class AnswerTooLong(httpx.RequestError):
    """The server's answer went on past the read's cap (`MAX_BYTES`)."""


class Transport(httpx.BaseTransport):
    """httpx's transport interface over `http1`: each request on the origin's shared pool, within its
    whole deadline, its answer (status, headers, body) read whole."""

    def __init__(self, whole: float, keepalive: float, max_bytes: int = MAX_BYTES) -> None:
        self._whole, self._keepalive, self._max_bytes = whole, keepalive, max_bytes
        self._pools: dict[Origin, http1.Pool] = {}  # held here: the shared registry keeps them weakly
        self._lock = threading.Lock()

    def pool(self, scheme: str, host: str, port: int) -> http1.Pool:
        key = (scheme, host, port)
        found = self._pools.get(key)
        if found is None:
            with self._lock:
                found = self._pools.get(key)
                if found is None:
                    found = self._pools[key] = http1.shared_pool(
                        scheme, host, port, POOL_SIZE, self._whole, self._whole, self._keepalive,
                        tls.context() if scheme == "https" else None)
        return found

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeout = (request.extensions.get("timeout") or {}).get("read")
        whole = self._whole if timeout is None else min(self._whole, timeout)
        deadline = time.monotonic() + whole
        url = request.url
        scheme = url.scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"{scheme!r} is not http or https: {url}")
        pool = self.pool(scheme, url.host, url.port or _DEFAULT_PORTS[scheme])
        body = request.read()
        headers = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in request.headers.raw if name.lower() not in _OURS}
        head = http1.request_head(pool, url.raw_path.decode("ascii"), headers, len(body), request.method)
        watch = Watch(WATCHDOG, deadline)
        try:
            answer = http1.exchange(pool, watch, head + body, deadline, self._max_bytes, whole, whole, headers=True)
        except http1.DeadlinePassed:
            raise httpx.ReadTimeout(f"no whole answer within {whole:g}s") from None
        except http1.ConnectFailed as exc:
            timed_out = isinstance(exc.__cause__, TimeoutError)
            raise (httpx.ConnectTimeout if timed_out else httpx.ConnectError)(str(exc)) from exc
        except OSError as exc:
            raise _failure(exc, watch, whole) from exc
        if not answer.complete:
            raise AnswerTooLong(f"the answer went on past {self._max_bytes} bytes")
        return httpx.Response(answer.status, headers=answer.headers, stream=httpx.ByteStream(answer.body),
                              extensions={"http_version": b"HTTP/1.1"})

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()  # its idle connections; `/generate`'s own, if it shares it, open new ones


def _failure(exc: OSError, watch: Watch, whole: float) -> httpx.HTTPError:
    """httpx's error for a failed exchange (`watch.fired`: the watchdog shut it at the deadline)."""
    if watch.fired or isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(f"no whole answer within {whole:g}s")
    if isinstance(exc, http1.NotSent):
        return httpx.WriteError(str(exc))
    if isinstance(exc, http1.NoAnswer):
        return httpx.ReadError(str(exc))
    if isinstance(exc, http1.ProtocolError):
        return httpx.RemoteProtocolError(str(exc))
    return httpx.ReadError(f"{exc.__class__.__name__}: {exc}")


def deadline_client(whole: float, headers: dict[str, str], keepalive: float = http1.KEEPALIVE) -> httpx.Client:
    """An httpx client each of whose requests ends within `whole` seconds in all, over `http1`."""
    return httpx.Client(transport=Transport(whole, keepalive), timeout=whole, headers=headers)
