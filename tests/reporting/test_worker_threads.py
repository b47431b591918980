"""A worker that can no longer work says so: it stops, hands back what it holds, and exits non-zero.

The worker depends on three threads of its own: the shard writer, the lease
keeper and the health monitor. Each survives every fault from outside the
process by design (Redis, storage and server faults are caught and retried),
so the death of one is brought about by the test-only hook
`FLEET_TEST_THREAD_FAULT=<thread name>` (`workers/reporting/lifeline.py`): SIGUSR2 raises
inside that thread, as a bug there would.
"""
from __future__ import annotations

import signal

import pytest
import redis

from contract.broker import kombu_redis
from workers.reporting.lifeline import EXIT_BROKEN

from conftest import varied_prompts, write_prompts
from waiting import wait_until

N = 12
LEASE = {"FLEET_LEASE_SECONDS": "20", "FLEET_RESTORE_INTERVAL": "1"}
THREADS = {"fleet-shards": "shard writer", "fleet-lease": "lease keeper", "fleet-health": "health monitor"}


@pytest.mark.parametrize("thread", sorted(THREADS))
def test_a_worker_whose_thread_dies_hands_back_its_prompts_and_exits_non_zero(fleet, tmp_path, thread):
    # Given a worker holding every prompt of a run, each of them generating for half a minute
    _, url = fleet.standin("--step-base", "0.25", "--output-len-max", "120")
    victim = fleet.worker("victim", [url], FLEET_TEST_THREAD_FAULT=thread, **LEASE)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(N))))
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: client.hlen(kombu_redis.UNACKED) == N, 120, "the worker holding every prompt", fleet)

    # When the thread dies
    victim.signal(signal.SIGUSR2)

    # Then the worker says why and exits non-zero, so that its supervisor restarts it ...
    assert victim.popen.wait(90) == EXIT_BROKEN, victim.tail()
    log = victim.log.read_text()
    assert f"worker cannot work on: its {THREADS[thread]} thread ({thread}) died: ThreadKilled()" in log
    # ... having handed back every prompt it held: each lease it held has run out at once (any
    # worker's restore sweep puts it back on the queue), rather than one lease later
    leases = client.zrange(kombu_redis.UNACKED_INDEX, 0, -1, withscores=True)
    assert len(leases) + fleet.states().get("done", 0) == N and {score for _, score in leases} <= {0.0}

    # And another worker stores every prompt once
    fleet.worker("survivor", [url], **LEASE)
    assert fleet.wait_finished(timeout=240) == {"done": N}
    ids = sorted(row["id"] for row in fleet.rows())
    assert ids == sorted(r["id"] for r in varied_prompts(N))
    assert fleet.dead_letters() == []
