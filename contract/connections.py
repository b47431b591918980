"""Redis clients for state outside the broker, and URLs safe to print.

One shared, thread-safe client per URL; built when first asked for, never at import.
"""
from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

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


SECRET_PARAMS = ("password", "passwd", "pass", "token", "key", "secret", "auth")


def redact_url(url: str) -> str:
    """The URL with its password hidden, in the user part or the query string, so that it
    can be logged or printed."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:  # a lone user part may be a password too (`redis://SECRET@host`)
        host = netloc.rpartition("@")[2]
        netloc = (f"{parts.username}:***@" if parts.password is not None and parts.username
                  else "***@") + host
    query = "&".join(_redact_param(pair) for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_param(pair: str) -> str:
    name, eq, _ = pair.partition("=")
    return f"{name}=***" if eq and any(s in name.lower() for s in SECRET_PARAMS) else pair
