"""One shared, thread-safe Redis client per URL for state outside the broker."""
from __future__ import annotations

from functools import lru_cache

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry


@lru_cache(maxsize=8)
def redis_for(url: str) -> redis.Redis:
    """Retry through a Redis restart rather than fail a finished generation."""
    return redis.Redis.from_url(
        url,
        socket_timeout=30,
        socket_connect_timeout=5,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=5, base=0.2), retries=30),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        decode_responses=False,
    )
