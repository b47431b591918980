"""A run's spec, read once per worker process.

A spec never changes once `enqueue` wrote it, so a worker reads each run's
from Redis the first time one of its prompts arrives, and keeps it.
"""
from __future__ import annotations

from functools import lru_cache

from contract.connections import redis_for
from contract.spec import RunSpec, load_spec


@lru_cache(maxsize=64)
def _cached_spec(url: str, run: str) -> RunSpec | None:
    return load_spec(redis_for(url), run)


def cached_spec(url: str, run: str) -> RunSpec:
    spec = _cached_spec(url, run)
    if spec is None:
        _cached_spec.cache_clear()
        raise LookupError(f"run {run!r} has no spec in Redis; was it enqueued with this REDIS_URL?")
    return spec
