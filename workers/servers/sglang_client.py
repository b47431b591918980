"""One call to SGLang's native `POST /generate`, and what its failures mean.

Failures fall in six classes, each handled differently by the task:
- `ServerUnavailable`: the server could not be reached (refused, unreachable,
  no connection or TLS handshake within `FLEET_CONNECT_TIMEOUT`: nothing was
  sent), died mid-request, or broke HTTP/1.1 (`http1.ProtocolError`). Not the
  prompt's fault: another server (or the queue) takes it, and it does not
  spend the prompt's retry budget (`FLEET_MAX_UNAVAILABLE` bounds it).
- `ServerDropped`: the server closed the connection with no answer after the
  request went out. Like `ServerUnavailable`, and the request loop asks
  whether the server died of it (`workers/servers/crashes.py`).
- `ServerCut`: the health monitor marked the server down (a wedged engine)
  while the request waited there, and `Client.cut` ended it. Not an attempt
  at all: another server (or the queue) takes the prompt at once.
- `ServerRefused`: HTTP 401/403, the server refusing this worker's
  credentials (`SGLANG_API_KEY`). The server is refused at once; the prompt
  goes elsewhere or back to the queue, its budget untouched.
- `TransientError`: 5xx, SGLang's 503 "queue is full", no complete answer
  within `FLEET_REQUEST_TIMEOUT`. Retried with backoff up to a budget, then
  dead-lettered as `server_error`.
- `BadOutput` (`workers/servers/answers.py`): a 200 that is not a generation of this
  model. Retried like a transient failure, then dead-lettered as `bad_output`.
- `ServerRejected`: HTTP 400, the server refusing this prompt (too long, bad
  parameters). Dead-lettered at once with SGLang's message.
- `GatewayOutage`: SGLang's gateway answering for itself that no worker can
  take a request (`workers/servers/gateway_answers.py`: 503 no_available_workers,
  its circuits open). An outage of the binding, not an attempt: the binding
  is paused and the prompt goes elsewhere or back to the queue, its budget
  untouched. The gateway's own upstream failures are `ServerUnavailable`.

A run of `--logprobs K` adds SGLang's top-level `return_logprob`,
`top_logprobs_num` and `logprob_start_len` to each request
(`contract.run.logprobs.request_fields`); its answer's log-probabilities must fit
its ids, or the answer is a `BadOutput`.

Invariant: a call reads at most `max_bytes` of the answer, and every wait in
it has a deadline: the whole exchange, from the wait for the answer's head to
the body's last byte, ends within the call's deadline (`FLEET_REQUEST_TIMEOUT`)
plus a watchdog tick (`workers/servers/deadlines.py`: a server that trickles bytes or
goes silent has its socket shut), each single read is also
bounded by the read timeout (the same setting), and connecting by
`FLEET_CONNECT_TIMEOUT`. The HTTP itself is `send` alone (post bytes, stream
the body under a size cap and a deadline, return status and bytes), so the
client library can be swapped there; everything around it is pure and tested
in-process.

A reused keep-alive connection that fails before a byte of answer (the
server closed it while idle, as the request went out) is not a failure: the
request goes once more on a fresh connection, within the same deadline.
Every server's TLS is the worker's one context (`tls.py`: the system's store).

The client is our own HTTP/1.1 exchange on pooled keep-alive sockets
(`http1.py`, answers parsed by llhttp; the health monitor's reads, `reads.py`,
go through the same pools), chosen by measurement (`python -m bench.http_clients`,
bench/README.md): one last-in-first-out pool per server, so a request costs
the same CPU with 16 or 2,048 in flight, and about a quarter of urllib3's
CPU per request (`http.client`'s header parsing and urllib3's wrappers were a
fifth of a busy worker's CPU). A single httpx client shared by the task
threads scans every pooled connection on each request and each close
(httpcore), which made the CPU per request grow with the number in flight.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

from contract.run.logprobs import Logprobs, request_fields

from .answers import read_answer, read_logprobs
from .cache_hits import cached_tokens
from .deadlines import WATCHDOG, Watch
from .gateway_answers import OUTAGE, gateway_failure
from .auth import Origin, basic_by_origin, origin
from .http1 import DeadlinePassed, Pool, request_head
from . import http1, tls

_WATCHDOG = WATCHDOG  # the process's one (`deadlines.py`), the reads' too


class GenerateError(Exception):
    pass


class ServerUnavailable(GenerateError):
    pass


class ServerCut(ServerUnavailable):
    pass


class ServerDropped(ServerUnavailable):
    """The request reached the server, which closed the connection without a byte of answer: the server
    may have died of it (`workers/servers/crashes.py` tells), or closed an idle connection as it came."""


class ServerRefused(GenerateError):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class TransientError(GenerateError):
    pass


class InFlightThere(TransientError):
    """The server still runs an earlier request for this prompt (SGLang refuses a `rid` in flight):
    ours, cut off before its answer, or a worker's that lost the prompt to this one (cut off from
    Redis, frozen) while its generation went on. Neither the prompt's fault nor the server's: the
    caller waits for it to end (`workers/intake/request_loop.py`)."""


class ServerRejected(GenerateError):
    pass


class GatewayOutage(GenerateError):
    pass


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    meta_info: dict
    server: str
    sampling: dict  # as sent, after any clamp to the server's context
    cached_tokens: int | None = None  # prompt tokens found in the server's prefix cache; None: unknown
    logprobs: Logprobs | None = None  # asked for (`enqueue --logprobs K`): checked against output_ids


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes      # at most the cap
    complete: bool   # False: the body went on past the cap and was cut off there


class Client:
    """One pool of keep-alive connections per server origin (`http1.Pool`, last in first out),
    shared by the task threads and with the health monitor's reads (`http1.shared_pool`), and the
    headers each origin gets: `SGLANG_API_KEY`'s bearer, or the HTTP Basic credentials its URL
    carried (`workers/servers/auth.py`)."""

    def __init__(self, pool_size: int, connect_timeout: float, request_timeout: float,
                 api_key: str | None, server_urls: list[str], keepalive: float):
        self._size = pool_size + 8
        self.connect_timeout, self.request_timeout, self._keepalive = connect_timeout, request_timeout, keepalive
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._basic = basic_by_origin(server_urls)
        self._pools: dict[Origin, Pool] = {}
        self._lock = threading.Lock()
        self._watches: dict[Origin, set[Watch]] = {}  # the requests in flight, by server

    def route(self, url: str) -> tuple[Pool, str, dict[str, str]]:
        """The pool, path and headers of a request to `url` (a binding's URL, maybe redacted)."""
        key, path = _split(url)
        pool = self._pools.get(key)
        if pool is None:
            with self._lock:
                pool = self._pools.get(key) or self._open(key)
        basic = self._basic.get(key)
        return pool, path, self._headers if basic is None else {**self._headers, "Authorization": basic}

    def _open(self, key: Origin) -> Pool:
        scheme, host, port = key
        pool = self._pools[key] = http1.shared_pool(scheme, host, port, self._size, self.connect_timeout,
                                                    self.request_timeout, self._keepalive,
                                                    tls.context() if scheme == "https" else None)
        return pool

    def watch(self, url: str, deadline: float) -> Watch:
        """A new request's deadline, listed under its server until `unwatch`, so `cut` finds it."""
        watch = Watch(_WATCHDOG, deadline)
        key = _split(url)[0]
        with self._lock:
            self._watches.setdefault(key, set()).add(watch)
        return watch

    def unwatch(self, url: str, watch: Watch) -> None:
        with self._lock:
            self._watches.get(_split(url)[0], set()).discard(watch)

    def cut(self, url: str, why: str) -> int:
        """End every request in flight to `url`'s server now (it was marked down); how many."""
        with self._lock:
            watches = list(self._watches.get(_split(url)[0], ()))
        for watch in watches:
            watch.cut(why)
        return len(watches)

    def close(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                pool.close()
            self._pools.clear()


@lru_cache(maxsize=256)
def _split(url: str) -> tuple[Origin, str]:
    """(origin, path and query) of a URL; its user part (credentials, or their redaction) dropped."""
    parts = urlsplit(url)
    return origin(url), urlunsplit(("", "", parts.path or "/", parts.query, ""))


def make_client(pool_size: int, connect_timeout: float, request_timeout: float,
                api_key: str | None, server_urls: list[str] = (), keepalive: float = http1.KEEPALIVE) -> Client:
    return Client(pool_size, connect_timeout, request_timeout, api_key, list(server_urls), keepalive)


def generate(client: Client, url: str, input_ids: list[int], sampling: dict, rid: str, *,
             timeout: float, max_bytes: int, id_bound: int, logprobs: int | None = None) -> Generation:
    """One request; a `Generation` whose ids and meta_info passed `read_answer` (and its top-`logprobs`
    log-probabilities `read_logprobs`, where asked), or a `GenerateError`."""
    body = {"input_ids": input_ids, "sampling_params": sampling, "rid": rid, "stream": False,
            **request_fields(logprobs)}
    reply = send(client, f"{url}/generate", json.dumps(body, separators=(",", ":")).encode(),
                 timeout=timeout, max_bytes=max_bytes)
    if reply.status == 200:
        output_ids, meta = read_answer(reply.body, complete=reply.complete,
                                       max_new_tokens=sampling.get("max_new_tokens"), bound=id_bound)
        scores = read_logprobs(meta, output_ids, logprobs) if logprobs else None
        return Generation(output_ids, meta, url, sampling, cached_tokens(meta, len(input_ids), url), scores)
    raise failure(url, reply.status, reply.body)


def send(client: Client, url: str, payload: bytes, *, timeout: float, max_bytes: int) -> Reply:
    """POST a JSON payload; the answer's status and at most `max_bytes` of its body, read within
    `timeout` seconds in all (a watchdog shuts the socket past it, and the deadline is checked
    between reads, so neither a trickling nor a silent server can hold it)."""
    deadline = time.monotonic() + timeout
    pool, path, headers = client.route(url)
    request = request_head(pool, path, headers, len(payload)) + payload
    watch = client.watch(url, deadline)
    try:
        answer = http1.exchange(pool, watch, request, deadline, max_bytes, client.connect_timeout,
                                client.request_timeout)
        return Reply(answer.status, answer.body, answer.complete)
    except DeadlinePassed as exc:
        raise TransientError(f"{url}: no complete answer within {timeout:.0f}s "
                             f"({exc.size} bytes so far; FLEET_REQUEST_TIMEOUT)") from None
    except http1.ConnectFailed as exc:  # refused, unreachable, timed out, TLS: the server's outage
        raise _late(url, timeout, watch) or ServerUnavailable(f"{url}: {exc}") from exc
    except TimeoutError as exc:  # one read outlasted the read timeout
        raise _late(url, timeout, watch) or TransientError(f"{url}: no answer in time ({exc})") from exc
    except http1.NoAnswer as exc:
        raise _late(url, timeout, watch) or ServerDropped(f"{url}: {exc}") from exc
    except OSError as exc:  # reset, cut off, malformed; or shut by the watchdog
        raise _late(url, timeout, watch) or ServerUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
    finally:
        client.unwatch(url, watch)


def _late(url: str, timeout: float, watch: Watch) -> GenerateError | None:
    """The deadline's error, if the watchdog shut this request; the cut's, if its server was marked down."""
    if watch.disarm():
        return None
    if watch.cut_because is not None:
        return ServerCut(f"{url}: cut, the server was marked down ({watch.cut_because})")
    return TransientError(f"{url}: no complete answer within {timeout:.0f}s (FLEET_REQUEST_TIMEOUT)")


def failure(url: str, status: int, body: bytes) -> GenerateError:
    """What a non-200 answer means for the prompt and the server."""
    message = error_message(body)
    gateway = gateway_failure(status, body)
    if gateway is not None:
        kind = GatewayOutage if gateway == OUTAGE else ServerUnavailable
        return kind(f"{url}: HTTP {status} {message} (the gateway's own answer)")
    if status in (401, 403):
        return ServerRefused(f"{url}: HTTP {status} {message}", status)
    if status in (400, 413, 422):
        if "duplicate request id" in message.lower():  # an earlier request for this prompt still runs there
            return InFlightThere(f"{url}: {message}")
        return ServerRejected(message)
    return TransientError(f"{url}: HTTP {status} {message}")


def error_message(body: bytes) -> str:
    """SGLang's error bodies come in three shapes; return the human part."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:500].decode("utf-8", "replace").strip()
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))[:500]
        if error:
            return str(error)[:500]
        for key in ("message", "detail"):
            if key in data:
                return str(data[key])[:500]
    return str(data)[:500]
