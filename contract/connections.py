"""Redis clients for state outside the broker, and URLs safe to print.

One shared, thread-safe client per URL; built when first asked for, never at import.
"""
from __future__ import annotations

from functools import lru_cache

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry


@lru_cache(maxsize=8)
def redis_for(url: str, max_connections: int = 64) -> redis.Redis:
    """A blocking pool: hundreds of task threads share a few connections and wait
    for one rather than fail; retries carry a call through a Redis restart."""
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=60,
        socket_timeout=30, socket_connect_timeout=5, health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=5, base=0.2), retries=30),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )
    return redis.Redis(connection_pool=pool)


SECRET_PARAMS = ("password", "passwd", "pass", "pwd", "token", "key", "secret", "auth", "credential")


def redact_url(url: str) -> str:
    """The URL with its secrets starred, so that it can be logged, printed or stored.

    Hidden: the value of any query parameter whose name looks secret
    (`?password=pw`), then everything before the last `@` (the user part:
    `redis://:pw@`, `redis://user:pw@`, where the user name stays, and a lone
    `redis://pw@`, which may be a password). Taking the last `@` anywhere keeps a
    password holding an unescaped `/`, `?`, `#` or `@` hidden, where a URL parser
    would read part of it as a path or a query; an `@` in a query makes it hide
    too much, never too little.
    """
    return _split(url)[0]


def redact_text(text: str, url: str) -> str:
    """`text` (an error message that may quote `url` or its parts) with every secret that
    `redact_url` hides starred, as written in the URL and percent-decoded."""
    from urllib.parse import unquote

    secrets = _split(url)[1]
    for secret in sorted({s for raw in secrets for s in (raw, unquote(raw)) if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _split(url: str) -> tuple[str, list[str]]:
    """(the URL redacted, the secrets it hid): the one reading of a URL's secrets."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    secrets: list[str] = []
    head, question, query = rest.partition("?")
    if question:
        rest = head + "?" + "&".join(_redact_param(pair, secrets) for pair in query.split("&"))
    userinfo, at, host = rest.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        safe_user = colon and user and not any(c in user for c in "/?#")
        secrets += ([password] if colon else []) + ([] if safe_user else [userinfo])
        rest = (f"{user}:***@" if safe_user else "***@") + host
    return (f"{scheme}://" if sep else "") + rest, secrets


def _redact_param(pair: str, secrets: list[str]) -> str:
    name, eq, value = pair.partition("=")
    if eq and any(s in name.lower() for s in SECRET_PARAMS):
        secrets.append(value)
        return f"{name}=***"
    return pair
