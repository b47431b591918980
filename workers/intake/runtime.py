"""The parts one worker process shares between its task threads.

Built once, when the worker's consumer starts, from the settings the Celery
app read at its entry point (never on import).
"""
from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field

import redis

from contract.redis_link.clock import CLOCK
from contract.fleet.provenance import Recorder
from contract.redis_link.connections import redact_url
from contract.storage.shard_home import home
from contract.redis_link.write_refusal import READ_ONLY

from ..servers import cache_hits, sharers
from ..reporting import metrics
from ..output import turns
from ..servers.affinity import Affinity
from ..servers.cpu_bound import CpuWatch, rule_for
from . import health_beat
from .deliveries import STARTED
from ..servers.health import HealthMonitor
from ..servers.auth import ServerCredentials
from .reconcile import ShardBook
from .redis_pool import worker_redis
from .redis_writes import RedisWrites
from ..servers.bindings import ServerPool
from ..settings import Settings
from ..servers.sglang_client import Client, make_client
from ..servers.tokenizers import TokenizerChecks
from ..servers.crashes import CrashWatch
from ..output.shards import ShardWriter
from ..output.verdicts import Verdicts

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    worker: str
    pool: ServerPool
    monitor: HealthMonitor
    http: Client
    redis: redis.Redis
    shards: ShardWriter
    writes: RedisWrites = field(default_factory=RedisWrites)
    affinity: Affinity = field(default_factory=Affinity)
    cpu: CpuWatch = field(default_factory=CpuWatch)
    tokenizers: TokenizerChecks | None = None  # whether each server's tokenizer is a run's
    crash_watch: CrashWatch | None = None  # whether a server that dropped a request died
    verdicts: Verdicts | None = None  # the runs' verifiers' check processes (`enqueue --verify`)
    # the (run, server, weight version) this process has recorded in its runs' provenance (contract/fleet/provenance.py)
    provenance: Recorder = field(default_factory=lambda: Recorder(socket.gethostname()))

    def close(self) -> None:
        self.monitor.stop()
        try:
            sharers.leave(self.redis, self.worker, [b.url for b in self.pool.bindings])
        except redis.RedisError as exc:  # its stamps then age out within a heartbeat's life
            log.debug("could not leave the servers' sharer counts (%r)", exc)
        self.shards.close()
        self.http.close()
        if self.verdicts is not None:
            self.verdicts.close()


_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime(settings: Settings, worker: str | None = None) -> Runtime:
    """The process's runtime, built by the first caller (a consumer step, with the worker's name)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = _build(settings, worker or socket.gethostname())
            _warn_if_redis_may_forget(_runtime.redis, settings.redis_url)
        return _runtime


def close_runtime() -> None:
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = None


def _build(s: Settings, worker: str) -> Runtime:
    key = s.sglang_api_key.get_secret_value() if s.sglang_api_key else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    pool = ServerPool(s.server_urls, s.max_inflight_per_server, s.affinity_margin)
    client = worker_redis(s.redis_url)
    shards = ShardWriter(s.output_dir, worker, s.group_rows, s.shard_max_wait, book=ShardBook(client, home(s.output_dir)),
                         commit_timeout=s.shard_commit_timeout)
    http = make_client(s.pool_size, s.connect_timeout, s.request_timeout, key, s.server_urls, s.keepalive_seconds)
    writes = RedisWrites()
    cpu = CpuWatch(rule_for(s.cpu_bound_share, s.cpu_bound_seconds))
    started: list[float] = []  # in each heartbeat (Redis's clock): the audit's sign of a restart under one name

    def heartbeat() -> None:  # also the probe of whether Redis takes writes (workers/intake/redis_writes.py)
        cpu.observe(*pool.free_slots())  # once a round: the CPU-bound signal's interval
        try:
            started[:] = started or [CLOCK.now(client)]
            health_beat.beat(client, worker, pool, s.heartbeat_ttl, holding=STARTED.holding,
                             storage=shards.storage.snapshot(),
                             cache_hits=cache_hits.WINDOW.snapshot(), cpu=cpu.snapshot(), started=started[0])
        except Exception as exc:
            if not writes.failed(exc):
                raise  # not a refusal: the health thread logs it as the heartbeat's trouble
            if writes.refused.cause == READ_ONLY:  # logged once by `writes`, not again as a failed heartbeat
                client.connection_pool.disconnect()  # a primary demoted under us: reconnect next round
            return
        writes.accepted()

    monitor = HealthMonitor(pool, s, headers, after_round=heartbeat,
                            cut=lambda binding, why: http.cut(binding.url, why))
    runtime = Runtime(settings=s, worker=worker, pool=pool, monitor=monitor, http=http, redis=client,
                      shards=shards, writes=writes, affinity=Affinity(s.affinity), cpu=cpu,
                      tokenizers=TokenizerChecks(monitor.client), crash_watch=CrashWatch(monitor.client),
                      verdicts=Verdicts(s.verify_timeout_seconds, s.verify_processes),
                      provenance=Recorder(worker))
    monitor.client.auth = ServerCredentials(s.server_urls)  # bindings hold redacted URLs
    log.info("worker %s bound to %s; broker %s; shards to %s; %d threads, at most %d in flight per server",
                worker, ", ".join(b.url for b in pool.bindings), redact_url(s.redis_url), s.output_dir,
                s.pool_size, s.max_inflight_per_server)
    monitor.start()
    metrics.serve(runtime, s.metrics_port)
    threading.Thread(target=turns.warm_runs, args=(client,), name="fleet-warm-runs", daemon=True).start()
    return runtime


def _warn_if_redis_may_forget(client: redis.Redis, url: str) -> None:
    """One line at start when Redis may drop queued work: an eviction policy other than
    `noeviction`, or no persistence at all. Managed Redis may refuse CONFIG: then say so."""
    try:
        conf = {}
        for name in ("maxmemory-policy", "appendonly", "save"):
            conf.update({_text(k): _text(v) for k, v in client.config_get(name).items()})
    except redis.RedisError as exc:
        log.warning("could not check Redis %s for eviction and persistence (%s): it needs "
                    "maxmemory-policy noeviction and appendonly yes", redact_url(url), exc)
        return
    problems, remedies = [], []
    if conf.get("maxmemory-policy", "noeviction") != "noeviction":
        problems.append(f"maxmemory-policy is {conf['maxmemory-policy']}, not noeviction (queued prompts "
                        "and ledger entries may be evicted)")
        remedies.append("maxmemory-policy noeviction")
    if conf.get("appendonly") != "yes" and not conf.get("save"):
        problems.append("no persistence, neither AOF nor RDB save points (a restart loses every queued prompt)")
        remedies.append("appendonly yes")
    if problems:
        log.warning("Redis %s may forget work: %s; set %s in its redis.conf (or CONFIG SET, then CONFIG REWRITE)",
                    redact_url(url), "; ".join(problems), " and ".join(remedies))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
