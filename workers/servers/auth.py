"""Credentials written into `SGLANG_URLS` (`http://user:token@host:port`), sent but never shown.

A server binding records its URL redacted (`contract.redis_link.connections.redact_url`),
so every place that shows or stores a server (logs, heartbeats and `status`,
metrics labels, the shards' `server` column, dead letters) holds
`http://user:***@host:port`. The credentials themselves live only here, as the
HTTP Basic header of each server's origin (scheme, host, port), built once from
the raw URLs: `basic_by_origin` for the `/generate` client
(`workers/servers/sglang_client.py`), and `ServerCredentials`, an httpx `Auth`, for the
health monitor's reads (`workers/servers/reads.py`: httpx's client over the same HTTP stack). Either adds the header to a request for that origin, as
httpx itself would have done from the URL; a server without credentials in its
URL gets its request untouched (with `SGLANG_API_KEY`'s bearer header, when set).
"""
from __future__ import annotations

import base64
from typing import Generator
from urllib.parse import unquote, urlsplit

import httpx

_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, "int | None"]


def origin(url: str) -> Origin:
    """(scheme, host, port) of a URL, the port filled in from the scheme; the same for a raw URL
    and its redacted form."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def basic_by_origin(urls: list[str]) -> dict[Origin, str]:
    """The `Authorization` header value of each origin whose URL carries a user part."""
    headers = {}
    for text in urls:
        parts = urlsplit(text)
        if parts.username or parts.password:
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            headers[origin(text)] = "Basic " + base64.b64encode(pair.encode()).decode()
    return headers


class ServerCredentials(httpx.Auth):
    """Basic auth for the servers whose URL carries a user part, by origin (httpx clients)."""

    def __init__(self, urls: list[str]):
        self._by_origin = basic_by_origin(urls)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        header = self._by_origin.get(origin(str(request.url)))
        if header is not None:
            request.headers["Authorization"] = header
        yield request
