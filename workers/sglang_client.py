"""One call to SGLang's native `POST /generate`, and what its failures mean.

Failures fall in five classes, each handled differently by the task:
- `ServerUnavailable`: the server could not be reached or died mid-request.
  Not the prompt's fault: another server (or the queue) takes it, and it does
  not spend the prompt's retry budget.
- `ServerRefused`: HTTP 401/403, the server refusing this worker's
  credentials (`SGLANG_API_KEY`). The server is refused at once; the prompt
  goes elsewhere or back to the queue, its budget untouched.
- `TransientError`: 5xx, SGLang's 503 "queue is full", no complete answer
  within `FLEET_REQUEST_TIMEOUT`. Retried with backoff up to a budget, then
  dead-lettered as `server_error`.
- `BadOutput` (`workers/answers.py`): a 200 that is not a generation of this
  model. Retried like a transient failure, then dead-lettered as `bad_output`.
- `ServerRejected`: HTTP 400, the server refusing this prompt (too long, bad
  parameters). Dead-lettered at once with SGLang's message.

Invariant: a call reads at most `max_bytes` of the answer, and every wait in
it has a deadline: the body is read under the call's deadline
(`FLEET_REQUEST_TIMEOUT`, checked between chunks, so a server trickling bytes
cannot hold a prompt), and each single read, the wait for the answer's head
included, under the client's read timeout (the same setting); a server that
goes silent after its head is thus cut within twice the deadline. The HTTP itself is `send` alone (post
bytes, stream the body under a size cap and a deadline, return status and
bytes), so the client library can be swapped there; everything around it is
pure and tested in-process.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from .answers import read_answer


class GenerateError(Exception):
    pass


class ServerUnavailable(GenerateError):
    pass


class ServerRefused(GenerateError):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class TransientError(GenerateError):
    pass


class ServerRejected(GenerateError):
    pass


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    meta_info: dict
    server: str
    sampling: dict  # as sent, after any clamp to the server's context


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes      # at most the cap
    complete: bool   # False: the body went on past the cap and was cut off there


def make_client(pool_size: int, connect_timeout: float, request_timeout: float,
                api_key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(
        headers=headers,
        timeout=httpx.Timeout(request_timeout, connect=connect_timeout, pool=request_timeout),
        limits=httpx.Limits(max_connections=pool_size + 8, max_keepalive_connections=pool_size + 8),
    )


def generate(client: httpx.Client, url: str, input_ids: list[int], sampling: dict, rid: str, *,
             timeout: float, max_bytes: int, id_bound: int) -> Generation:
    """One request; a `Generation` whose ids and meta_info passed `read_answer`, or a `GenerateError`."""
    body = {"input_ids": input_ids, "sampling_params": sampling, "rid": rid, "stream": False}
    reply = send(client, f"{url}/generate", json.dumps(body, separators=(",", ":")).encode(),
                 timeout=timeout, max_bytes=max_bytes)
    if reply.status == 200:
        output_ids, meta = read_answer(reply.body, complete=reply.complete,
                                       max_new_tokens=sampling.get("max_new_tokens"), bound=id_bound)
        return Generation(output_ids, meta, url, sampling)
    raise failure(url, reply.status, reply.body)


def send(client: httpx.Client, url: str, payload: bytes, *, timeout: float, max_bytes: int) -> Reply:
    """POST a JSON payload; the answer's status and at most `max_bytes` of its body, read within
    `timeout` seconds in all (checked between chunks, so a trickling server cannot hold it)."""
    deadline = time.monotonic() + timeout
    try:
        with client.stream("POST", url, content=payload, headers={"Content-Type": "application/json"}) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    return Reply(response.status_code, b"".join(chunks)[:max_bytes], complete=False)
                if time.monotonic() > deadline:
                    raise TransientError(f"{url}: no complete answer within {timeout:.0f}s "
                                         f"({size} bytes so far; FLEET_REQUEST_TIMEOUT)")
            return Reply(response.status_code, b"".join(chunks), complete=True)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError,
            httpx.ReadError, httpx.WriteError, httpx.PoolTimeout) as exc:
        raise ServerUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
    except httpx.TimeoutException as exc:
        raise TransientError(f"{url}: no answer in time ({exc.__class__.__name__})") from exc


def failure(url: str, status: int, body: bytes) -> GenerateError:
    """What a non-200 answer means for the prompt and the server."""
    message = error_message(body)
    if status in (401, 403):
        return ServerRefused(f"{url}: HTTP {status} {message}", status)
    if status in (400, 413, 422):
        if "duplicate request id" in message.lower():  # our own earlier attempt still runs there
            return TransientError(f"{url}: {message}")
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
