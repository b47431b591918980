"""One worker process keeps a batch-256 server busy with short answers, or says it cannot, against real processes.

The regime where a worker's own cost per sample weighs most: the saturation
bench's `1x256:short` (a batch-256 stand-in with its continuous-batching time
model, ~100-token answers, hundreds of samples a second) and 10,000 prompts
queued before the worker starts, every fleet setting at its default. Either
the worker keeps the batch full (7/8 of its slots running: the server's
throughput within ~5% of a full batch's, fleet / ideal >= 0.95), or the
worker is the bottleneck and says so (`workers/servers/cpu_bound.py`: its servers
had 1/8 of their slots free while it used its core): never a half-empty
server and a silent worker, as issue #34 found (0.73 of the ideal client,
no signal).

At its defaults one worker now keeps up here, so the signal's other half is
held to the same regime with a worker that cannot: started in a cgroup whose
CPU quota is an eighth of a core (about 110 samples a second, against the
server's ~270; at a quarter core it now makes ~220 a second and nearly keeps
up, which is no test of the signal), it must say it is CPU-bound and name the
quota to raise.
"""
from __future__ import annotations

import re

import httpx
import pytest
import redis

from conftest import write_prompts
from contract.fleet import heartbeats
from contract.ledger.ledger import Ledger
from cpu_quota import EIGHTH, cpu_quota_group, launch_in
from metric_pages import sum_of, worker_page
from producer.local import free_port, start_worker
from waiting import wait_until

BATCH = 256
SHORT = ("--max-running-requests", str(BATCH), "--step-base", "0.004", "--step-per-request", "0.00002",
         "--output-len-median", "100", "--output-len-sigma", "0.3", "--output-len-max", "300")
DEFAULTS = {"FLEET_SHARD_MAX_WAIT": "2.0", "FLEET_HEALTH_INTERVAL": "5.0", "FLEET_AUDIT_INTERVAL": "30"}


def queue_short_prompts(fleet, tmp_path, total: int = 10_000) -> str:
    """A batch-256 server answering ~100 tokens a prompt, and `total` prompts queued; its URL."""
    _, url = fleet.standin(*SHORT)
    records = [{"id": f"busy-{i:05d}", "prompt": f"Question {i}: what is {i} + {i * 7}?"} for i in range(total)]
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    return url


@pytest.mark.xdist_group("measures")  # the server's fill and the worker's CPU: never beside another measuring test
def test_one_worker_keeps_a_batch_256_server_full_of_short_answers_or_says_it_is_cpu_bound(fleet, tmp_path):
    # Given a batch-256 server answering ~100 tokens a prompt, and 10,000 prompts queued
    total = 10_000
    url = queue_short_prompts(fleet, tmp_path, total)

    # When one worker, every setting at its default, drains them
    fleet.worker("w1", [url], **DEFAULTS)
    client = redis.Redis.from_url(fleet.redis_url)
    steady: list[tuple[int, bool]] = []  # (requests running on the server, the worker said CPU-bound)

    def drained() -> bool:
        done = Ledger(client, "default").tally().done
        if 0.2 * total <= done <= 0.8 * total:  # the steady part: neither the start nor the drain
            running = httpx.get(f"{url}/standin/stats", timeout=10).json()["running"]
            beats = heartbeats.read_all(client)
            steady.append((running, any((b.get("cpu") or {}).get("bound") for b in beats)))
        return done >= total

    wait_until(drained, 900, "10,000 short answers stored", fleet, poll=0.5)

    # Then every prompt is stored
    assert fleet.wait_finished(timeout=120) == {"done": total}
    # and through the steady part the batch stayed full, or the worker said it was the bottleneck
    assert len(steady) >= 10, steady
    full = sum(running for running, _ in steady) / len(steady) >= BATCH * 7 / 8
    said_bound = any(bound for _, bound in steady)
    assert full or said_bound, (f"server ran {sum(r for r, _ in steady) / len(steady):.0f} of {BATCH} on average "
                                f"and the worker never said it was CPU-bound: {steady}")


@pytest.mark.xdist_group("measures")  # the worker's CPU share: never beside another measuring test
def test_a_worker_held_to_an_eighth_of_a_core_by_its_cgroup_says_it_is_cpu_bound_and_names_the_quota(fleet, tmp_path):
    # Given the same server and 10,000 prompts, and a cgroup whose CPU quota is an eighth of a core
    url = queue_short_prompts(fleet, tmp_path)
    with cpu_quota_group(EIGHTH) as group:
        # When one worker, every setting at its default, works in that group from its first instruction
        port = free_port()
        env = fleet.env(SGLANG_URLS=url, FLEET_METRICS_PORT=str(port), **DEFAULTS)
        worker = start_worker(fleet.logs, "w1", env, launch=launch_in(group))
        fleet.processes.append(worker)

        # Then its heartbeat says it is CPU-bound on the eighth of a core it can use, its server with room
        client = redis.Redis.from_url(fleet.redis_url)

        seen: dict = {}
        readings: list[dict] = []  # what the heartbeat said meanwhile: the failure's evidence

        def said_bound() -> bool:
            cpus = [b.get("cpu") or {} for b in heartbeats.read_all(client)]
            readings.extend(c | {"done": Ledger(client, "default").tally().done} for c in cpus[:1])
            seen.update(next((c for c in cpus if c.get("bound")), {}))
            return bool(seen)

        try:
            wait_until(said_bound, 180, "the worker's heartbeat saying CPU-bound", fleet, poll=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nits CPU readings, every 20th: {readings[::20]}") from None
        assert seen["cores"] == EIGHTH and seen["slots"] == BATCH and seen["free_slots"] >= BATCH / 8, seen
        # and the remedy it names is the quota and the file that sets it, not another process in the group
        quota_file = f"{group}/cpu.cfs_quota_us"
        assert quota_file in seen["remedy"] and "another worker process in the same cgroup" in seen["remedy"], seen
        # and its log says so once, with that remedy
        lines = re.findall(r"worker CPU-bound: .*", worker.tail(100_000))
        assert len(lines) == 1 and "of the 0.125 cores it can use" in lines[0] and quota_file in lines[0], lines
        # and its metrics show it bound on an eighth of a core
        page = worker_page(port)
        assert sum_of(page, "fleet_worker_cpu_bound") == 1.0, httpx.get(page).text
        assert sum_of(page, "fleet_worker_cpu_cores") == 0.125, httpx.get(page).text
        # (the rest of the run is not waited for: at an eighth of a core it is two minutes' work)
        worker.stop(timeout=30)
