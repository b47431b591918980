"""One call to SGLang's native `POST /generate`, and what its failures mean.

Failures fall in three classes, each handled differently by the task:
- `ServerUnavailable`: the server could not be reached or died mid-request.
  Not the prompt's fault: another server (or the queue) takes it, and it does
  not spend the prompt's retry budget.
- `TransientError`: 5xx, SGLang's 503 "queue is full", a timeout. Retried with
  backoff up to a budget, then dead-lettered as `server_error`.
- `ServerRejected`: HTTP 400, the server refusing this prompt (too long, bad
  parameters). Dead-lettered at once with SGLang's message.
"""
from __future__ import annotations

from dataclasses import dataclass

import httpx


class GenerateError(Exception):
    pass


class ServerUnavailable(GenerateError):
    pass


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


def make_client(pool_size: int, connect_timeout: float, request_timeout: float,
                api_key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(
        headers=headers,
        timeout=httpx.Timeout(request_timeout, connect=connect_timeout, pool=request_timeout),
        limits=httpx.Limits(max_connections=pool_size + 8, max_keepalive_connections=pool_size + 8),
    )


def generate(client: httpx.Client, url: str, input_ids: list[int], sampling: dict, rid: str) -> Generation:
    body = {"input_ids": input_ids, "sampling_params": sampling, "rid": rid, "stream": False}
    try:
        response = client.post(f"{url}/generate", json=body)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError,
            httpx.ReadError, httpx.WriteError, httpx.PoolTimeout) as exc:
        raise ServerUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
    except httpx.TimeoutException as exc:
        raise TransientError(f"{url}: no answer in time ({exc.__class__.__name__})") from exc
    status = response.status_code
    if status == 200:
        data = response.json()
        if isinstance(data, list):  # a batch answer; we always send one prompt
            data = data[0]
        return Generation(list(data["output_ids"]), dict(data.get("meta_info") or {}), url, sampling)
    message = _error_message(response)
    if status in (401, 403):
        raise ServerUnavailable(f"{url}: HTTP {status} {message}: SGLANG_API_KEY missing or wrong")
    if status in (400, 413, 422):
        if "duplicate request id" in message.lower():  # our own earlier attempt still runs there
            raise TransientError(f"{url}: {message}")
        raise ServerRejected(message)
    raise TransientError(f"{url}: HTTP {status} {message}")


def _error_message(response: httpx.Response) -> str:
    """SGLang's error bodies come in three shapes; return the human part."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error:
            return str(error)
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:500]
