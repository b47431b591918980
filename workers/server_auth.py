"""Credentials written into `SGLANG_URLS` (`http://user:token@host:port`), sent but never shown.

A server binding records its URL redacted (`contract.connections.redact_url`),
so every place that shows or stores a server (logs, heartbeats and `status`,
metrics labels, the shards' `server` column, dead letters) holds
`http://user:***@host:port`. The credentials themselves live only here: an
httpx `Auth` that the worker's HTTP clients carry, which adds HTTP Basic auth
to each request for that server's origin, as httpx itself would have done from
the URL. A server without credentials in its URL gets its request untouched
(with `SGLANG_API_KEY`'s bearer header, when set).
"""
from __future__ import annotations

from typing import Generator

import httpx

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme)


class ServerCredentials(httpx.Auth):
    """Basic auth for the servers whose URL carries a user part, by origin."""

    def __init__(self, urls: list[str]):
        self._by_origin: dict[tuple, httpx.BasicAuth] = {}
        for text in urls:
            url = httpx.URL(text)
            if url.username or url.password:
                self._by_origin[_origin(url)] = httpx.BasicAuth(url.username, url.password)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        basic = self._by_origin.get(_origin(request.url))
        if basic is None:
            yield request
        else:
            yield from basic.auth_flow(request)
