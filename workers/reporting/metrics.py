"""Prometheus metrics of one worker process (`FLEET_METRICS_PORT`, 0 to disable).

Counters and histograms are updated where things happen; gauges that describe
shared state (server health, in-flight requests, whether the output storage
takes writes, queue and dead-letter depth) are read when Prometheus scrapes,
so they are never stale. Flower has no
queue-length metric on Redis, hence the queue gauges here.
"""
from __future__ import annotations

import logging

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from . import lifeline

log = logging.getLogger(__name__)

PROMPTS = Counter("fleet_prompts_total", "Prompts finished, by outcome (stored or dead).", ["run", "outcome"])
TOKENS = Counter("fleet_tokens_total", "Tokens of stored samples, by direction (prompt or output).", ["direction"])
LATENCY = Histogram("fleet_generation_seconds", "One /generate request, sent to answered.", ["server"],
                    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 3600))
VERIFY_FAILURES = Counter("fleet_verification_failures_total", "Generations failing a think rule.", ["reason"])
VERDICTS = Counter("fleet_verdicts_total", "Samples checked by their run's verifier (enqueue --verify), by verdict "
                   "class: pass, fail or error (a check that raised, hung or crashed).", ["verdict"])
DEAD_LETTERS = Counter("fleet_dead_letters_total", "Prompts dead-lettered, by reason.", ["reason"])
RETRIES = Counter("fleet_retries_total", "Requests tried again, by kind (transient, unavailable, or in_flight: "
                  "an earlier request for the prompt still ran there).", ["kind"])
SHARD_COMMITS = Counter("fleet_shard_commits_total", "Shard files made durable.")
SHARD_COMMIT_SECONDS = Histogram("fleet_shard_commit_seconds", "Writing one shard until it is durable (the "
                                 "file synced and renamed into place).",
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
SHARD_ROWS = Counter("fleet_shard_rows_total", "Samples written into shards.")
RECONCILED = Counter("fleet_reconciled_total", "Prompts found stored in a shard when delivered again (their "
                     "worker died before marking them done): marked done, not generated again.")
PROMPT_TOKENS = Counter("fleet_prompt_tokens_total", "Prompt tokens of every generation a server answered "
                        "(stored or not).", ["server"])
CACHED_TOKENS = Counter("fleet_cached_tokens_total", "Prompt tokens the server found in its prefix cache "
                        "(meta_info.cached_tokens), where it said; hit share = rate of this / rate of "
                        "fleet_prompt_tokens_total.", ["server"])
STORAGE_FAILURES = Counter("fleet_storage_failures_total", "Shard writes the output storage refused (retried).")


class FleetCollector:
    """Gauges read at scrape time from the worker's runtime and Redis."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.trouble = lifeline.Trouble("metrics: queue depths from Redis")

    def collect(self):
        up = GaugeMetricFamily("fleet_server_up", "1 when the server is healthy and accepted.", labels=["server"])
        in_flight = GaugeMetricFamily("fleet_server_in_flight", "Requests in flight.", labels=["server"])
        target = GaugeMetricFamily("fleet_server_target", "Requests the worker keeps in flight there, tuned "
                                   "from its capacity and load (workers/servers/capacity.py).", labels=["server"])
        capacity = GaugeMetricFamily("fleet_server_capacity", "Requests the server runs at once, as it "
                                     "reports (0: not reported).", labels=["server"])
        for b in self.runtime.pool.bindings:
            up.add_metric([b.url], 1.0 if b.usable else 0.0)
            in_flight.add_metric([b.url], b.in_flight)
            target.add_metric([b.url], b.target)
            capacity.add_metric([b.url], b.capacity or 0)
        yield up
        yield in_flight
        yield target
        yield capacity
        yield self._storage()
        yield from self._cpu()
        yield from self._depths()

    def _storage(self):
        storage = self.runtime.shards.storage
        up = GaugeMetricFamily("fleet_storage_up", "1 when the last shard write (or probe) to OUTPUT_DIR "
                               "worked; 0 while the worker holds its samples and takes no prompts.")
        up.add_metric([], 1.0 if storage.up else 0.0)
        return up

    def _cpu(self):
        watch = self.runtime.cpu
        bound = GaugeMetricFamily("fleet_worker_cpu_bound", "1 while this worker process is the bottleneck: its "
                                  "CPU near the cores it can use while its servers have free slots; "
                                  "remedy: another worker process on the node, or where a cgroup quota below one "
                                  "core is the limit, a higher quota (workers/servers/cpu_bound.py).")
        bound.add_metric([], 1.0 if watch.rule.bound else 0.0)
        cores = GaugeMetricFamily("fleet_worker_cpu_cores", "The cores this worker process can use: one (the GIL), "
                                  "or less under its cgroup's CPU quota (workers/servers/cpu_limits.py).")
        cores.add_metric([], watch.cores)
        share = GaugeMetricFamily("fleet_worker_cpu_share", "CPU this worker process used over the last health "
                                  "round, as a share of the CPU time it had the chance to use: the cores it can "
                                  "use (one: the GIL; less under a cgroup quota), or what it used plus its CPUs' "
                                  "idle time where that is less.")
        share.add_metric([], watch.last.share if watch.last else 0.0)
        yield bound
        yield cores
        yield share

    def _depths(self):
        from contract.ledger.deadletters import DeadLetters
        from contract.broker.kombu_redis import queue_depth
        from contract.run.spec import run_queues

        queue = GaugeMetricFamily("fleet_queue_depth", "Prompts waiting in the queue.", labels=["queue"])
        dead = GaugeMetricFamily("fleet_dead_letter_depth", "Dead letters of a run.", labels=["run"])
        client, prefix = self.runtime.redis, self.runtime.settings.queue_prefix
        try:
            queues = run_queues(client, prefix)
            for run in queues:
                dead.add_metric([run], DeadLetters(client, run).count())
            for name in sorted({prefix, *queues.values()}):
                queue.add_metric([name], queue_depth(client, name))
            self.trouble.ok()
        except Exception as exc:  # Redis restarting: report what we have
            self.trouble.failed(exc)
        yield queue
        yield dead


def serve(runtime, port: int) -> int | None:
    """Serve /metrics on `port`, or the next free one (several workers on a node), on
    `FLEET_METRICS_HOST` (loopback by default: the page names runs, queues and servers)."""
    if port <= 0:
        return None
    host = runtime.settings.metrics_host
    REGISTRY.register(FleetCollector(runtime))
    for candidate in range(port, port + 32):
        try:
            start_http_server(candidate, addr=host)
        except OSError:
            continue
        log.info("metrics on http://%s:%d/metrics", host, candidate)
        return candidate
    log.warning("no free metrics port in %d-%d on %s; metrics disabled: set FLEET_METRICS_PORT to a free range",
                port, port + 31, host)
    return None
