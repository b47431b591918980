"""A run's spec, read once per worker process.

A spec never changes once `enqueue` wrote it, so a worker reads each run's
from Redis the first time one of its prompts arrives, and keeps it. A run of
an older key layout is refused (`refusal`) before its ledger is read.
"""
from __future__ import annotations

import logging
from functools import lru_cache

from contract.run.spec import OlderLayout, RunSpec, load_spec

from .redis_pool import worker_redis

log = logging.getLogger(__name__)
_REFUSED: set[str] = set()  # runs whose refusal this process has logged


@lru_cache(maxsize=64)
def _cached_spec(url: str, run: str) -> RunSpec | None:
    return load_spec(worker_redis(url), run)


def cached_spec(url: str, run: str) -> RunSpec:
    spec = _cached_spec(url, run)
    if spec is None:
        _cached_spec.cache_clear()
        raise LookupError(f"run {run!r} has no spec in Redis; was it enqueued with this REDIS_URL?")
    return spec


def refusal(url: str, run: str) -> str | None:
    """Why this worker does not take the run's prompts (an older layout wrote it), logged
    once per run; None for any other run (one it takes, one without a spec or with an
    unreadable one)."""
    try:
        _cached_spec(url, run)
    except OlderLayout as exc:
        if run not in _REFUSED:
            _REFUSED.add(run)
            log.error("%s", exc)
        return f"refused: {exc}"
    except ValueError:  # a spec that cannot be read: said where the spec is used, as before
        return None
    return None
