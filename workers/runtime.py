"""The parts one worker process shares between its task threads.

Built once, when the worker's consumer starts (never on import, so that the
producer can import the Celery app without starting health checks).
"""
from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass

import httpx
import redis

from . import heartbeat, metrics
from .health import HealthMonitor
from .redis_client import redis_for
from .servers import ServerPool
from .settings import Settings, get_settings, redact_url
from .sglang_client import make_client
from .shards import ShardWriter

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    worker: str
    pool: ServerPool
    monitor: HealthMonitor
    http: httpx.Client
    redis: redis.Redis
    shards: ShardWriter

    def close(self) -> None:
        self.monitor.stop()
        self.shards.close()
        self.http.close()


_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime(worker: str | None = None) -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = _build(worker or f"{socket.gethostname()}")
        return _runtime


def close_runtime() -> None:
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = None


def _build(worker: str) -> Runtime:
    s = get_settings()
    key = s.sglang_api_key.get_secret_value() if s.sglang_api_key else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    pool = ServerPool(s.server_urls, s.max_inflight_per_server)
    client = redis_for(s.redis_url)
    monitor = HealthMonitor(pool, s, headers, after_round=lambda: heartbeat.publish(
        client, worker, pool, ttl=3 * s.health_interval + s.health_timeout))
    runtime = Runtime(
        settings=s, worker=worker, pool=pool, monitor=monitor,
        http=make_client(s.pool_size, s.connect_timeout, s.request_timeout, key),
        redis=client,
        shards=ShardWriter(s.output_dir, worker, s.shard_max_rows, s.shard_max_wait),
    )
    log.warning("worker %s bound to %s; broker %s; shards to %s; %d threads, %d in flight per server",
                worker, ", ".join(s.server_urls), redact_url(s.redis_url), s.output_dir,
                s.pool_size, s.max_inflight_per_server)
    monitor.start()
    metrics.serve(runtime, s.metrics_port)
    return runtime
