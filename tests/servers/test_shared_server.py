"""Many workers on one server, and a worker that knows when it is the bottleneck, against real processes.

Workers bound to the same server each tune their in-flight target by their
share of it (`workers/servers/capacity.py`), so together they keep one batch full and
finish equal shares; a worker whose own CPU is the limit while its server has
free slots says so in its log, in `status` and in a metric
(`workers/servers/cpu_bound.py`).
"""
from __future__ import annotations

import collections
import json
import re

import pytest
import redis

from bench.shared_server import ready_to_share
from conftest import write_prompts
from contract.fleet import heartbeats
from metric_pages import sum_of, worker_page
from producer.local import free_port
from waiting import wait_until

# About a second and a half a generation, so three workers really share the batch for a while.
SLOW = ("--step-base", "0.01", "--output-len-median", "150", "--output-len-sigma", "0.1", "--output-len-max", "200")


def prompts(n: int, prefix: str) -> list[dict]:
    return [{"id": f"{prefix}-{i:04d}", "prompt": f"Question {i}: what is {i} + {i * 7}?"} for i in range(n)]


def wait_ready(fleet, names: list[str]) -> None:
    """Until each named worker's heartbeat shows its server healthy with a capacity read, and shared
    by all of them (the bench's rule, `ready_to_share`): the run is queued only then, so that no
    worker takes a head start on the others' share."""
    def ready() -> bool:
        records = heartbeats.read_all(redis.Redis.from_url(fleet.redis_url))
        return set(names) <= ready_to_share(records, len(names))
    wait_until(ready, 180, f"workers {names} ready", fleet, poll=0.5)


@pytest.mark.xdist_group("measures")  # a share of the work: never beside another measuring test
def test_three_workers_on_one_server_each_finish_a_fair_share_and_every_prompt_is_accounted_for(fleet, tmp_path):
    # Given three workers bound to one batch-16 server, every fleet setting at its default
    _, url = fleet.standin("--max-running-requests", "16", *SLOW)
    names = ["w1", "w2", "w3"]
    for name in names:
        fleet.worker(name, [url])
    wait_ready(fleet, names)
    total = 144

    # When one run of nine batches' worth of prompts drains through them
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts(total, "share"))))
    states = fleet.wait_finished(timeout=400)

    # Then every prompt is stored exactly once, none dead
    assert states == {"done": total}
    rows = fleet.rows()
    assert sorted(row["id"] for row in rows) == [f"share-{i:04d}" for i in range(total)]
    # and each worker stored a share within 20% of every other's
    shares = collections.Counter(row["worker"].split("@")[0] for row in rows)
    assert set(shares) == set(names), shares
    assert min(shares.values()) >= 0.8 * max(shares.values()), shares


@pytest.mark.xdist_group("measures")  # the worker's own CPU share: never beside another measuring test
def test_a_worker_whose_cpu_is_the_limit_says_so_in_its_log_status_and_metric(fleet, tmp_path):
    # Given an instant server with a large batch and tiny answers, and a run of many short prompts
    # all queued (so that the worker never waits for the producer): the worker's own CPU is the only
    # limit, the server always has free slots.
    _, url = fleet.standin("--max-running-requests", "256", "--step-base", "0", "--step-per-request", "0",
                           "--prefill-per-token", "0", "--output-len-median", "20", "--output-len-sigma", "0.1",
                           "--output-len-max", "30")
    total = 6000  # ~20 s of work for one process here: the signal needs 2 s of it, the checks a few more
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts(total, "cpu"))))

    # When one worker drains it. The share is counted against the CPU it had the chance to use (its
    # waits for a core left out), so a busy machine does not hide it; the line is lowered to half a
    # core all the same, since the stand-in and Redis take some of the worker's work on 2 cores.
    port = free_port()
    worker = fleet.worker("w1", [url], FLEET_CPU_BOUND_SHARE="0.5", FLEET_CPU_BOUND_SECONDS="2",
                          FLEET_METRICS_PORT=str(port))

    # Then, while it works, `status` shows it CPU-bound with the remedy
    def bound() -> bool | None:
        records = heartbeats.read_all(redis.Redis.from_url(fleet.redis_url))
        if not records:  # its first health round not done yet
            return None
        (record,) = records
        return (record.get("cpu") or {}).get("bound")

    wait_until(lambda: bound() is True, 240, "the worker's heartbeat saying CPU-bound", fleet, poll=0.5)
    # (its CPU share moves with the machine's load, so each view is read until it shows the signal)
    seen: dict = {}

    def status_says_bound() -> bool:
        (w,) = json.loads(fleet.producer("status", "--json").stdout)["workers"]
        seen.update(w["cpu"] if w["cpu"].get("bound") else {})
        return bool(seen)

    wait_until(status_says_bound, 120, "`status --json` showing the worker CPU-bound", fleet, poll=0.5)
    assert seen["remedy"] == "start another worker process on this node (same SGLANG_URLS)"
    assert seen["slots"] == 256 and seen["free_slots"] >= 32
    wait_until(lambda: "CPU-BOUND" in fleet.producer("status").stdout, 120, "`status` saying CPU-BOUND", fleet,
               poll=0.5)
    # and its metrics say so
    wait_until(lambda: sum_of(worker_page(port), "fleet_worker_cpu_bound") == 1.0,
               120, "fleet_worker_cpu_bound 1", fleet, poll=0.5)
    # and its log says so once, with the remedy
    assert fleet.wait_finished(timeout=400) == {"done": total}
    # and once the run is over and it idles, it says it is no longer bound, once
    wait_until(lambda: bound() is False, 120, "the worker back to normal", fleet, poll=0.5)
    (w,) = json.loads(fleet.producer("status", "--json").stdout)["workers"]
    assert w["cpu"]["bound"] is False and "remedy" not in w["cpu"]
    log = worker.tail(100000)
    # (each change once, never once a round: on a loaded machine the share may cross the line again)
    changes = re.findall(r"worker (CPU-bound: .*start another worker process on this node|no longer CPU-bound)", log)
    assert changes and all(c.startswith("CPU-bound") == (i % 2 == 0) for i, c in enumerate(changes)), log
    assert changes[-1] == "no longer CPU-bound", log

