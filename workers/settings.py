"""Fleet settings, read from the environment (the interface contract's names).

`REDIS_URL`, `SGLANG_URLS`, `OUTPUT_DIR` and `SGLANG_API_KEY` are the contract;
everything else is tuning with a `FLEET_` prefix and a default sized for SGLang's
continuous batching rather than for a CPU pool.
"""
from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr, field_validator

from contract.settings import SharedSettings


MAX_THREADS = 8192  # the default thread pool's ceiling (FLEET_CONCURRENCY=0)


class Settings(SharedSettings):
    """`REDIS_URL`, `OUTPUT_DIR` and the queue prefix come from `SharedSettings`."""

    sglang_urls: str = Field("http://localhost:30000", validation_alias=AliasChoices("SGLANG_URLS", "sglang_urls"))
    sglang_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("SGLANG_API_KEY", "sglang_api_key"))

    # Routing: the most requests in flight on one server (a gateway counts as one). The
    # worker tunes each server's own number below this bound from what the server reports
    # (workers/capacity.py: its running batch, plus a short queue).
    max_inflight_per_server: int = 1024
    # Threads in the worker pool; 0 means twice the bound x servers, at most 8192. Threads
    # start only when a prompt needs one, and the prompts held follow the tuned capacity
    # (workers/gate.py), so the default costs nothing on small servers.
    concurrency: int = 0
    # Affinity (workers/affinity.py): a conversation's next turn to the server of its last turn,
    # a prompt to the server recently sent its leading tokens, while that server's load is within
    # this share of capacity of the least loaded one's. FLEET_AFFINITY=off routes by load alone.
    affinity: bool = True
    affinity_margin: float = Field(0.25, ge=0.0)

    # The CPU-bound signal (workers/cpu_bound.py): this process's CPU at or above this share of
    # the core(s) it can use, while its servers have free slots, for this many seconds.
    cpu_bound_share: float = 0.85
    cpu_bound_seconds: float = 10.0

    # Health checks: SGLang answers /health in about a second, so never time
    # out below two seconds.
    health_interval: float = 5.0
    health_timeout: float = 5.0
    health_failures: int = 3
    health_successes: int = 2

    # One /generate request: connect quickly, but let a long generation run.
    # request_timeout is the whole call's deadline, checked while the body streams in.
    connect_timeout: float = 10.0
    request_timeout: float = 3600.0
    # The most bytes of one answer read before it is refused as `bad_output`;
    # 0 derives it from the request's max_new_tokens (workers/answers.py: answer_cap).
    max_answer_bytes: int = 0
    # Transient failures (5xx, 503 queue full, timeouts) before `server_error`.
    max_attempts: int = 5
    retry_backoff: float = 1.0
    retry_backoff_max: float = 60.0
    # Connection failures while servers restart do not spend the budget above,
    # but a prompt gives up after this many of them.
    max_unavailable: int = 50
    # How long a task waits for a healthy server before going back to the queue.
    server_wait: float = 30.0
    # Unexpected task failures (not server or verification failures) before a
    # prompt becomes a `worker_error` dead letter instead of being requeued.
    max_crashes: int = 3
    # A prompt whose worker died holding it (OOM, a native crash) more than this many
    # times, the last time alone, becomes a `poison` dead letter instead of killing the next.
    max_deliveries: int = 5
    # Resample once before dead-lettering a verification failure.
    resample_on_verify_failure: bool = False

    # Leases: a dead worker's prompts return to the queue after this long; a
    # live worker renews its own well before then.
    lease_seconds: float = 120.0
    restore_interval: float = 10.0
    # Lost-message audit: how often, and the longest queue it lists.
    audit_interval: float = 30.0
    audit_max_queue: int = 10_000
    # Behind Sentinel (`sentinel://`): how often the worker asks the Sentinels where the primary
    # is, so that after a failover it stops writing to the old one within this long
    # (workers/failover.py).
    failover_check_interval: float = Field(
        1.0, gt=0, description="Seconds between a worker's questions to the Sentinels (sentinel:// only) "
        "of where the primary is: after a failover it moves to the new primary, and asserts there what "
        "it holds and stored, within this long.")
    # SIGTERM: finish in-flight prompts for this long, then hand the rest back.
    shutdown_grace: float = 60.0

    # Group commit: a shard is written when it holds this many samples or its
    # oldest sample has waited this long; tasks are acknowledged after.
    shard_max_rows: int = 1000
    shard_max_wait: float = 2.0
    # The longest a finished sample waits for its shard (storage failing, say) before its
    # prompt goes back to the queue (never to the dead letters).
    shard_commit_timeout: float = 300.0

    # Celery task events (task-received/started/succeeded per task, for Flower and `celery events`),
    # published in batches by the event loop's timer (workers/events.py).
    task_events: bool = True
    # Celery's own two INFO lines per task ("Task ... received", "Task ... succeeded in ..."):
    # noise at hundreds of prompts a second, and their logging lock cost a busy worker ~7% of
    # its CPU. Off, the worker still logs every dead letter, give-back and failure itself.
    task_log: bool = False

    # Prometheus metrics; the next free port is taken when several workers share a node.
    metrics_port: int = 9808
    metrics_host: str = "127.0.0.1"  # FLEET_METRICS_HOST: loopback unless told (0.0.0.0 for a Prometheus elsewhere)

    @field_validator("health_timeout")
    @classmethod
    def _health_timeout_floor(cls, value: float) -> float:
        return max(value, 2.0)

    @property
    def server_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.sglang_urls.split(",") if u.strip()]

    @property
    def group_rows(self) -> int:
        """Samples that make a group commit due: FLEET_SHARD_MAX_ROWS, or half the worker's
        threads if fewer. A thread waiting for its shard cannot start a prompt, so a worker
        with few threads and fast answers (16 in flight, ~0.1 s answers) would otherwise spend
        most of FLEET_SHARD_MAX_WAIT with its threads idle: 15 samples a second, not 200."""
        return max(1, min(self.shard_max_rows, self.pool_size // 2))

    @property
    def pool_size(self) -> int:
        return self.concurrency or min(2 * self.max_inflight_per_server * len(self.server_urls), MAX_THREADS)
