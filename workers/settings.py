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

    sglang_urls: str = Field("http://localhost:30000", validation_alias=AliasChoices("SGLANG_URLS", "sglang_urls"),
                             description="Comma-separated base URLs of the SGLang servers (or one gateway) this "
                             "worker is bound to; credentials written in a URL go as Basic auth to that server only.")
    sglang_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("SGLANG_API_KEY", "sglang_api_key"),
                                             description="Sent to the servers as `Authorization: Bearer`; "
                                             "never logged.")

    max_inflight_per_server: int = Field(1024, description="The most requests in flight on one server (a gateway "
                                         "counts as one): an upper bound; each server's own number is tuned from what "
                                         "it reports ([capacity](../design/capacity.md)).")
    concurrency: int = Field(0, description="Worker threads; 0: twice `FLEET_MAX_INFLIGHT_PER_SERVER` x servers, at "
                             "most 8,192, started only when a prompt needs one (the prompts a worker holds follow "
                             "its servers' tuned capacity, plus those waiting for a shard's group commit, which "
                             "hold no server slot).")
    affinity: bool = Field(True, description="Send a conversation's next turn to the server of its last turn, and a "
                            "prompt to the server recently sent its leading tokens (its prefix cache holds them); "
                            "`off`: by load alone ([affinity](../design/affinity.md)).")
    affinity_margin: float = Field(0.25, ge=0.0, description="The load guard of affinity: the preferred server is "
                                    "used while its load (requests as a share of capacity) is at most this much above "
                                    "the least loaded server's; beyond it load wins.")

    cpu_bound_share: float = Field(0.85, description="The worker says it is CPU-bound when its process used at least "
                                    "this share of the CPU time it had the chance to use: the cores it can use (one, "
                                    "the GIL; less under a cgroup CPU quota), or less where the node's CPUs sat idle "
                                    "less than that, while its servers had at least an eighth of their slots free, for "
                                    "`FLEET_CPU_BOUND_SECONDS`; back to normal below the share less 0.15, or with the "
                                    "servers full (less than a sixteenth free), for as long "
                                    "([worker CPU](../design/worker-cpu.md)).")
    cpu_bound_seconds: float = Field(10.0, description="How long the CPU-bound condition (`FLEET_CPU_BOUND_SHARE`) "
                                      "must hold before the worker says so, and its end before it says it is no "
                                      "longer bound.")

    health_interval: float = Field(5.0, description="Seconds between two health rounds of each server.")
    health_timeout: float = Field(5.0, description="Deadline of one whole health call; never below 2 s (SGLang takes "
                                  "about a second to answer `/health`).")
    health_failures: int = Field(3, description="Failed health rounds in a row before a server is marked down.")
    health_successes: int = Field(2, description="Healthy rounds in a row before a server is used again.")

    connect_timeout: float = Field(10.0, description="Deadline for connecting to a server (TCP, then the TLS "
                                   "handshake): a server not reached within it is unavailable, as one that "
                                   "refuses the connection, and the prompt's `FLEET_MAX_ATTEMPTS` is not spent.")
    keepalive_seconds: float = Field(4.0, gt=0, description="How long an idle connection to a server is used again; "
                                     "keep it below the servers' own idle timeout (SGLang's: 5 s), or a request "
                                     "may meet the server closing it (it is then sent once more on a new "
                                     "connection, not counted).")
    request_timeout: float = Field(3600.0, description="The deadline of a whole `/generate` call: a server that "
                                     "trickles bytes or goes silent is cut within it plus 0.25 s, and the attempt "
                                     "is a transient failure.")
    max_answer_bytes: int = Field(0, description="The largest answer read before it is refused as `bad_output` "
                                   "(0: 256 B per allowed token + 64 KiB).")
    max_attempts: int = Field(5, description="Transient failures (5xx, 503 queue full, timeouts) before a prompt "
                               "becomes a `server_error` dead letter.")
    retry_backoff: float = Field(1.0, description="First wait, in seconds, before a transient failure is tried again "
                                 "(it doubles each time).")
    retry_backoff_max: float = Field(60.0, description="The longest wait between two tries of a prompt.")
    context_length: int = Field(
        0, ge=0,
        description="The servers' context length (SGLang's --context-length), for servers whose own the worker "
                    "cannot read: behind a gateway whose servers it cannot reach. Where servers report theirs, the "
                    "smaller is used. 0: read it from the servers, and give no prompt to a server or gateway "
                    "whose length cannot be read.")
    max_unavailable: int = Field(50, description="Connection failures while servers restart do not spend "
                                  "`FLEET_MAX_ATTEMPTS`, but a prompt gives up after this many of them.")
    server_wait: float = Field(30.0, description="How long a task waits for a healthy server before its prompt goes "
                                "back to the queue.")
    max_crashes: int = Field(3, description="Unexpected task failures (a bug, not the server or the output) before "
                              "a prompt becomes a `worker_error` dead letter with its traceback, instead of being "
                              "requeued.")
    max_deliveries: int = Field(5, description="Deliveries a prompt's workers may die holding (OOM, a native crash) "
                                 "before it becomes a `poison` dead letter (the last time alone in its worker).")
    resample_on_verify_failure: bool = Field(False, description="Resample once before dead-lettering a generation "
                                               "that fails verification (with another seed where it had one).")
    verify_timeout_seconds: float = Field(10.0, gt=0, description="The longest one answer's check by the run's "
                                          "verifier (`enqueue --verify`) may take: past it the check's process is "
                                          "killed and the sample stored with the verdict `error: timeout after Ns` "
                                          "([verification](../data/verification.md)).")
    verify_processes: int = Field(2, ge=1, description="Processes per verifier in each worker process, each checking "
                                   "one answer at a time (a check runs in a process of its own, so one that raises, "
                                   "hangs or crashes costs its sample an `error` verdict, never the worker).")

    lease_seconds: float = Field(120.0, description="A dead worker's prompts return to the queue after this; a live "
                                   "worker renews its own well before then.")
    restore_interval: float = Field(10.0, description="How often a worker looks for expired leases to return to the "
                                     "queue.")
    redis_connections: int = Field(2, ge=1, description=(
        "Connections the worker's short Redis calls share (its own and kombu's); with kombu's "
        "blocking fetch, the remote-control subscription and the lease keeper's own connection the "
        "worker holds this many plus three."))
    audit_interval: float = Field(30.0, description="How often the lost-message audit runs: it republishes a queued "
                                   "prompt whose message is neither in the queue nor in flight nor held by a live "
                                   "worker.")
    audit_max_queue: int = Field(10_000, description="The audit runs only while the queue is at most this long (it "
                                    "lists the queue).")
    audit_slice: int = Field(5_000, ge=1, description=(
        "Pending prompts of a run the lost-message audit looks at per round at most (a cursor over the "
        "run's prompts, so a pass takes at least pending / slice rounds): with "
        "`FLEET_AUDIT_HEARTBEATS` it bounds a round's cost, whatever the fleet or what is in flight."))
    audit_heartbeats: int = Field(500, ge=1, description=(
        "Workers whose heartbeats one round of the lost-message audit reads, about (it stops at the "
        "page of 100 pending prompts that reaches it). The trade: a round's Redis cost (~1.8 us a "
        "heartbeat read) against a pass's length, since where the fleet is larger, a round looks at "
        "fewer prompts than a slice (about 700 at 1,000 workers with 500) and a pass takes more rounds."))
    failover_check_interval: float = Field(
        1.0, gt=0, description="Seconds between a worker's questions to the Sentinels (sentinel:// only) "
        "of where the primary is: after a failover it moves to the new primary, and asserts there what "
        "it holds and stored, within this long.")
    shutdown_grace: float = Field(60.0, description="On SIGTERM: finish in-flight prompts for this long, then hand "
                                   "the rest back to the queue.")

    shard_max_rows: int = Field(1000, description="Group commit of a shard: written when it holds this many samples "
                                  "(or half the worker's threads, if fewer: a thread waiting for its shard starts no "
                                  "prompt) or its oldest sample has waited `FLEET_SHARD_MAX_WAIT`.")
    # 5 s, not 2: a node finishing 2 long samples a second commits ~11 a group, not ~5, so its
    # shards are twice as large and Redis sees half the round trips per sample (the group's take,
    # intakes, writing entries and done marks are a round trip each): 0.66 against 1.16 a sample in
    # `python -m bench --parts fleet` (2026-12-05). A sample is durable at most 5 s after it ends.
    shard_max_wait: float = Field(5.0, description="Group commit of a shard: written at the latest when its oldest "
                                  "sample has waited this long.")
    shard_commit_timeout: float = Field(300.0, description="The longest a finished sample waits for its shard "
                                         "(storage failing, say) before its prompt goes back to the queue, never to "
                                         "the dead letters.")

    task_events: bool = Field(True, description="Celery task events per task (Flower's task pages, "
                               "`celery events`), sent in batches (`FLEET_TASK_EVENTS_INTERVAL`, "
                               "`workers/reporting/events.py`).")
    task_events_interval: float = Field(5.0, gt=0, description=(
        "Seconds between two flushes of a worker's task events, one Redis PUBLISH each: Flower's task "
        "pages lag the work by up to this (each event keeps the time it happened). Shorter costs Redis "
        "one round trip more per worker per flush (at 1 s, one per 2 samples of a node at 2 a second)."))
    # Off by default: at hundreds of prompts a second these lines' logging lock cost a busy worker ~7% of its CPU.
    task_log: bool = Field(False, description="Celery's own two INFO lines per task (\"received\", \"succeeded "
                             "in\"); the worker logs every dead letter, give-back and failure itself either way.")

    metrics_port: int = Field(9808, description="Port of the worker's Prometheus `/metrics` (the next free port "
                               "when several workers share a node; 0: off).")
    metrics_host: str = Field("127.0.0.1", description="The address `/metrics` binds to: loopback unless told "
                                      "(`0.0.0.0` for a Prometheus on another host).")

    @field_validator("health_timeout")
    @classmethod
    def _health_timeout_floor(cls, value: float) -> float:
        return max(value, 2.0)

    @property
    def heartbeat_ttl(self) -> float:
        """Seconds a heartbeat lives: three health rounds and one more round's deadline, so a
        worker that stops writing is gone from `status` and the audit a few rounds later."""
        return 3 * self.health_interval + self.health_timeout

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
