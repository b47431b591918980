"""A take whose answer is lost strands nothing (`contract/broker/kombu_take.py`'s token, `workers/intake/transport.py`).

Real processes: redis-server, a stand-in, `celery -A workers worker` connected to Redis through a proxy
(tests/take_cut.py) that lets Redis run the take's script and then cuts the connection before its
answer reaches the worker: the first time, the time redis-py's fail-fast retry sends it again (the
take stays pending, the consumer reconnects), and the time the next channel reads it back.
"""
from __future__ import annotations

from collections import Counter

import httpx
import redis

from contract.broker import kombu_take
from contract.broker.kombu_redis import UNACKED

from conftest import varied_prompts, write_prompts
from take_cut import CutAfterScript
from waiting import wait_until

PROMPTS = 40
# a lease short enough that a stranded message would be the audit's within the test (lease + restore
# + 2 audit rounds = 15 s), and a take large enough to carry many messages at once
ENV = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1", "FLEET_AUDIT_INTERVAL": "3",
       "FLEET_CONCURRENCY": "64", "FLEET_MAX_INFLIGHT_PER_SERVER": "64"}


def test_a_take_cut_after_redis_ran_it_delivers_each_message_once_and_strands_none(fleet, tmp_path):
    # Given 40 prompts queued, and a worker whose Redis connections go through a proxy that cuts
    # the take's script three times after Redis ran it (the take, its fail-fast retry, its read-back)
    _, url = fleet.standin()
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(PROMPTS))))
    port = int(fleet.redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = CutAfterScript(port, kombu_take.TAKE.sha, cuts=3)
    try:
        worker = fleet.worker("w1", [url], REDIS_URL=proxy.url, **ENV)

        # When it takes them (Redis runs each cut take: messages leave the queue, recorded under its lease)
        wait_until(lambda: len(proxy.cut) == 3, 90, "three takes cut after Redis answered", fleet)
        states = fleet.wait_finished(timeout=120)
    finally:
        proxy.close()

    # Then Redis had run every cut take (its answer an array, not an error)
    assert all(answer.startswith(b"*") for answer in proxy.cut), proxy.cut
    # and every prompt was generated once and stored once, none dead-lettered, nothing left unacknowledged
    assert states == {"done": PROMPTS}
    generations = httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]
    assert len(generations) == PROMPTS and set(generations.values()) == {1}, generations
    counts = Counter(r["id"] for r in fleet.rows())
    assert len(counts) == PROMPTS and set(counts.values()) == {1}, counts
    assert fleet.dead_letters() == []
    wait_until(lambda: redis.Redis.from_url(fleet.redis_url).hlen(UNACKED) == 0, 30, "every delivery acknowledged",
               fleet)
    # and no message waited for the audit (a stranded one is back only when the audit republishes it)
    log = worker.log.read_text(errors="replace")
    assert "republished" not in log, log[-3000:]
