"""A partition longer than a lease: a worker cut off from Redis while it generates, then healed.

The cut-off worker talks to Redis through a proxy (`netfault.py`) that, on cue,
forwards nothing it sends and closes no connection: packets held, as a network
partition holds them. Its leases run out, another worker generates its prompts
again (they were generating at the cut, so that is allowed), and when the
network heals the cut-off worker finishes what it held, without a restart.
"""
from __future__ import annotations

import json
import socket
from collections import Counter

import httpx
import pyarrow.parquet as pq
import redis

from contract.keys import WORKER_PREFIX
from producer.local import free_port, start_redis

from conftest import varied_prompts, wait_until, write_prompts
from netfault import NetFault

LEASE = {"FLEET_LEASE_SECONDS": "6", "FLEET_RESTORE_INTERVAL": "1"}


def _generations(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]


def _exported(fleet, dest) -> Counter:
    fleet.producer("export", str(dest))
    return Counter(r["id"] for f in sorted(dest.glob("part-*.parquet"))
                   for r in pq.read_table(f, columns=["id"]).to_pylist())


def _status(fleet) -> dict:
    return json.loads(fleet.producer("status", "--json").stdout)


def _partitioned(fleet, tmp_path, partitions: int) -> None:
    # Given w1, whose every connection to Redis passes through a proxy, and w2 beside it
    _, url = fleet.standin("--fault-slow", "1", "--slow-seconds", "10")
    port = free_port()
    broker, fleet.redis_url = start_redis(fleet.logs, port=port)
    fleet.processes.append(broker)
    proxy = NetFault(port)
    client = redis.Redis.from_url(fleet.redis_url)
    w1_beat = WORKER_PREFIX + f"w1@{socket.gethostname()}"
    w1 = fleet.worker("w1", [url], REDIS_URL=proxy.url, **LEASE)
    w2 = fleet.worker("w2", [url], **LEASE)
    wait_until(lambda: client.exists(w1_beat) and
               sum(1 for c in client.client_list() if c.get("cmd") == "brpop") >= 2, 90, "both consuming", fleet)

    ids: set[str] = set()
    for n in range(partitions):
        # and prompts that take longer than a lease, w1 generating some of them
        batch = varied_prompts(12, prefix=f"p{n}")
        ids |= {r["id"] for r in batch}
        fleet.producer("enqueue", str(write_prompts(tmp_path / f"p{n}.jsonl", batch)))
        wait_until(lambda: sum(1 for pid in _generations(url) if pid in ids) == len(ids), 60,
                   "the batch generating", fleet)

        # When w1 is cut off from Redis for several leases (until its heartbeat has expired and w2 has
        # generated again and stored what w1 held), and then the network heals
        proxy.hold_all()
        wait_until(lambda: not client.exists(w1_beat), 60, "w1's heartbeat gone", fleet)
        wait_until(lambda: "queued" not in fleet.states() and
                   max(c for pid, c in _generations(url).items() if pid.startswith(f"p{n}-")) >= 2, 120,
                   "w2 has stored every prompt of the batch, w1's too", fleet)
        proxy.release()
        wait_until(lambda: client.exists(w1_beat), 60, "w1 back", fleet)

    # Then every prompt is stored, the export holds each once, and status adds up
    assert fleet.wait_finished(timeout=120) == {"done": len(ids)}
    assert _exported(fleet, tmp_path / "export") == {pid: 1 for pid in ids}
    wait_until(lambda: _status(fleet)["in_flight"] == 0, 60, "nothing left in flight", fleet)
    status = _status(fleet)
    assert (status["prompts"], status["done"], status["dead"], status["pending"]) == (len(ids), len(ids), 0, 0)
    assert fleet.dead_letters() == []

    # And w1 goes on working by itself: alone, it takes and stores a new batch
    w2.stop()
    fleet.producer("enqueue", str(write_prompts(tmp_path / "q.jsonl", varied_prompts(4, prefix="q"))))
    assert fleet.wait_finished(timeout=120) == {"done": len(ids) + 4}
    assert {r["worker"].split("@")[0] for r in fleet.rows() if r["id"].startswith("q-")} == {"w1"}
    assert w1.alive()


def test_a_partition_longer_than_a_lease_leaves_every_prompt_in_exactly_one_place(fleet, tmp_path):
    _partitioned(fleet, tmp_path, partitions=1)


def test_two_partitions_in_a_row_leave_every_prompt_in_exactly_one_place(fleet, tmp_path):
    _partitioned(fleet, tmp_path, partitions=2)
