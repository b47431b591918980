"""A worker's prefix-cache figures: read from each answer, counted, and kept for the last minutes.

`cached_tokens` reads `meta_info.cached_tokens` of one answer: the server's
figure, or None where it is unknown. Absent or null is an older server or the
radix cache turned off; a value that is not an integer in `[0, prompt_len]` is
a server fault, logged once per server and then treated as unknown, never a
reason to lose the generation (`workers/servers/answers.py` checks only what the
shard's other columns need).

`observe` counts every generation a server answered: its prompt tokens in
`fleet_prompt_tokens_total{server}`, its cached tokens, where known, in
`fleet_cached_tokens_total{server}` (so a server that never reports has no
cached series, and a dashboard shows no data for it rather than 0%), and both
into `WINDOW`, which the heartbeat sends for `status`.

`HitWindow` invariant: it holds, per server, one `Hits` per `bucket_s` seconds
of the worker's monotonic clock, and drops buckets older than `window_s`, so
its memory is servers x window_s / bucket_s tallies however many generations
pass, and a snapshot covers the last `window_s - bucket_s` to `window_s`
seconds. Sums only, so `status` adds the snapshots of many workers.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

from contract.fleet.cache_hits import WINDOW_S, Hits

from ..reporting import metrics

log = logging.getLogger(__name__)

BUCKET_S = 10
_warned: set[str] = set()
_warned_lock = threading.Lock()


def cached_tokens(meta: dict, prompt_len: int, server: str) -> int | None:
    """The prompt tokens the server found in its prefix cache, or None where unknown."""
    value = meta.get("cached_tokens")
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= prompt_len:
        return value
    _warn_once(server, f"server {server} answered meta_info.cached_tokens={value!r} for a prompt of "
                       f"{prompt_len} tokens (not an integer in [0, {prompt_len}]): a server fault; "
                       "counted as unknown (further ones from this server are not logged)")
    return None


def _warn_once(server: str, message: str) -> None:
    with _warned_lock:
        if server in _warned:
            return
        _warned.add(server)
    log.warning(message)


class HitWindow:
    """Per server, the `Hits` of the last `window_s` seconds in buckets of `bucket_s` (thread-safe)."""

    def __init__(self, window_s: float = WINDOW_S, bucket_s: float = BUCKET_S,
                 clock: Callable[[], float] = time.monotonic):
        self.window_s, self.bucket_s, self.clock = window_s, bucket_s, clock
        self._buckets = max(1, int(window_s // bucket_s))
        self._servers: dict[str, deque[tuple[int, Hits]]] = {}
        self._lock = threading.Lock()

    def add(self, server: str, prompt_len: int, cached: int | None) -> None:
        now = self._bucket()
        with self._lock:
            buckets = self._servers.setdefault(server, deque())
            if not buckets or buckets[-1][0] != now:
                buckets.append((now, Hits()))
            buckets[-1][1].add(prompt_len, cached)
            self._expire(buckets, now)

    def snapshot(self) -> dict:
        """What the heartbeat carries: `{window_s, servers: {url: Hits as a dict}}`, servers with
        nothing in the window left out."""
        now = self._bucket()
        servers = {}
        with self._lock:
            for url, buckets in self._servers.items():
                self._expire(buckets, now)
                if buckets:
                    total = Hits()
                    for _, hits in buckets:
                        total.merge(hits)
                    servers[url] = total.to_dict()
        return {"window_s": self.window_s, "servers": servers}

    def _bucket(self) -> int:
        return int(self.clock() // self.bucket_s)

    def _expire(self, buckets: deque, now: int) -> None:
        while buckets and buckets[0][0] <= now - self._buckets:
            buckets.popleft()


WINDOW = HitWindow()


def observe(server: str, prompt_len: int, cached: int | None) -> None:
    """One generation the server answered: into the counters and the window."""
    metrics.PROMPT_TOKENS.labels(server).inc(prompt_len)
    if cached is not None:
        metrics.CACHED_TOKENS.labels(server).inc(cached)
    WINDOW.add(server, prompt_len, cached)
