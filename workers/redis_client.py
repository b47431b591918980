"""One shared, thread-safe Redis client per URL for state outside the broker."""
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
