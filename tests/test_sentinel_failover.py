"""Behind Redis Sentinel, a failover loses nothing that was acknowledged and runs nothing twice.

A real topology (a primary, a replica, three Sentinels; `sentinel_topology.py`),
real workers, real producer commands and the SGLang stand-in, which counts the
generations of each prompt. In each case, mid-run: every prompt ends stored
with its exact tokens or dead-lettered with its reason, the export holds each
id once, and only a prompt that was in flight at the failover may be generated
a second time: one started before it was settled (stored or dead-lettered)
and before the failover ended. A failover ends when the old primary is
demoted: until then it still answers the clients it has, and a message it
hands out there (which the new primary still holds) is delivered twice.
"""
from __future__ import annotations

import json
import signal
import socket
from collections import Counter
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from contract.connections import redis_for
from contract.ledger import Ledger
from sglang_standin.cli import parse_config
from sglang_standin.outputs import generate_output

from conftest import Fleet, messages_of, render, varied_prompts, write_prompts
from waiting import wait_until
from sentinel_topology import MASTER, Topology
from test_flower import start_flower, worker_online

N = 120
MAX_NEW_TOKENS = 512  # some prompts hit it: dead letters (truncated) beside the stored samples
STANDIN = ("--step-base", "0.05", "--max-running-requests", "64")
WORKER = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}


class SentinelFleet(Fleet):
    """The fleet of `conftest` with `REDIS_URL` naming the Sentinels, and the test's own reads
    through the same kind of client the fleet uses (it follows the master)."""

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(FLEET_SENTINEL_MASTER=MASTER, **extra)

    def states(self, run: str = "default") -> dict[str, int]:
        return Ledger(redis_for(self.redis_url), run).counts()


@pytest.fixture
def topology(tmp_path: Path):
    t = Topology(tmp_path / "logs").start()
    yield t
    t.stop()


@pytest.fixture
def sfleet(tmp_path: Path, topology: Topology):
    f = SentinelFleet(tmp_path, topology.url)
    yield f
    f.stop()


def _generations(url: str) -> Counter:
    return Counter(httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"])


def _mid_run(fleet: SentinelFleet, tmp_path: Path) -> tuple[str, list[dict]]:
    """Given a stand-in, two workers and N prompts enqueued through the Sentinels, when the
    first samples are stored and most of the run is still ahead."""
    _, url = fleet.standin(*STANDIN)
    fleet.worker("w1", [url], **WORKER)
    fleet.worker("w2", [url], **WORKER)
    records = varied_prompts(N)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)),
                   "--max-new-tokens", str(MAX_NEW_TOKENS))
    wait_until(lambda: fleet.states().get("done", 0) >= 1, 120, "the first samples stored", fleet)
    assert fleet.states().get("queued", 0) >= N // 4  # mid-run: much of the work is still ahead
    return url, records


def _each_prompt_in_one_place(fleet: SentinelFleet, tokenizer, tmp_path: Path, url: str, records: list[dict],
                              in_flight: set[str]) -> None:
    """Then every prompt is stored token-exact or dead-lettered with its reason, the export
    holds each stored id once, and only prompts in flight at the failover ran twice."""
    states = fleet.wait_finished(timeout=300)
    assert sum(states.values()) == N and set(states) <= {"done", "dead"}
    rows = fleet.rows()
    stored = {row["id"]: row for row in rows}
    dead = {d["id"]: d for d in fleet.dead_letters()}
    assert set(stored) | set(dead) == {r["id"] for r in records} and not set(stored) & set(dead)
    assert all(d["reason"] for d in dead.values())
    cfg = parse_config(["--port", "1", *STANDIN])
    for record in records:
        if record["id"] in stored:
            ids = render(tokenizer, messages_of(record))
            output, _ = generate_output(ids, MAX_NEW_TOKENS, cfg)
            assert stored[record["id"]]["input_ids"] == ids + output, record["id"]
    fleet.producer("export", str(tmp_path / "export"))
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    exported = [i for f in manifest["files"]
                for i in pq.read_table(tmp_path / "export" / f["name"], columns=["id"]).column("id").to_pylist()]
    assert sorted(exported) == sorted(stored)
    again = {pid for pid, n in _generations(url).items() if n > 1}
    assert again <= in_flight, f"generated again though not in flight at the failover: {sorted(again - in_flight)}"


def _settled(fleet: SentinelFleet) -> set[str]:
    """Prompts stored (a row in a shard) or dead-lettered by now."""
    return {row["id"] for row in fleet.rows()} | {d["id"] for d in fleet.dead_letters()}


def _in_flight(url: str, settled_before: set[str]) -> set[str]:
    """Prompts whose generation had started by now and that were not settled before the fault."""
    return set(_generations(url)) - settled_before


def test_a_primary_killed_mid_run_loses_nothing_and_runs_nothing_twice(sfleet, topology, tokenizer, tmp_path):
    url, records = _mid_run(sfleet, tmp_path)

    # When the primary is SIGKILLed and Sentinel promotes the replica
    old = topology.primary_port()
    settled_before = _settled(sfleet)
    topology.servers[old].kill()
    topology.wait_switched(old)
    in_flight = _in_flight(url, settled_before)

    # Then
    _each_prompt_in_one_place(sfleet, tokenizer, tmp_path, url, records, in_flight)


def test_a_primary_frozen_past_down_after_comes_back_as_a_replica_and_its_stale_writes_are_lost(
        sfleet, topology, tokenizer, tmp_path):
    url, records = _mid_run(sfleet, tmp_path)

    # When the primary is frozen (SIGSTOP) until Sentinel has promoted the replica, then resumed
    old = topology.primary_port()
    settled_before = _settled(sfleet)
    topology.servers[old].signal(signal.SIGSTOP)
    new = topology.wait_switched(old)
    topology.servers[old].signal(signal.SIGCONT)

    # Then it comes back as the new primary's replica (its own writes of the moment discarded)...
    topology.wait_replica(old, new)
    in_flight = _in_flight(url, settled_before)  # the failover lasts until the old primary is demoted
    # ...and the run ends with every prompt in one place
    _each_prompt_in_one_place(sfleet, tokenizer, tmp_path, url, records, in_flight)


def test_a_clean_sentinel_failover_loses_nothing_and_runs_nothing_twice(sfleet, topology, tokenizer, tmp_path):
    url, records = _mid_run(sfleet, tmp_path)

    # When an operator asks the Sentinels for a failover
    old = topology.primary_port()
    settled_before = _settled(sfleet)
    topology.failover()
    new = topology.wait_switched(old)

    # Then the old primary follows the new one, and every prompt ends in one place
    topology.wait_replica(old, new)
    in_flight = _in_flight(url, settled_before)  # the failover lasts until the old primary is demoted
    _each_prompt_in_one_place(sfleet, tokenizer, tmp_path, url, records, in_flight)


def test_flower_and_status_work_through_a_sentinel_url(sfleet, tmp_path):
    # Given a worker and Flower on a Sentinel URL, and a few prompts enqueued through it
    _, url = sfleet.standin()
    sfleet.worker("w1", [url], **WORKER)
    _, flower = start_flower(sfleet, FLOWER_BASIC_AUTH="fleet:secret")
    sfleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(5))))

    # When they are stored
    assert sfleet.wait_finished() == {"done": 5}

    # Then status reads the run, and Flower sees the worker and the queue through the Sentinels
    report = json.loads(sfleet.producer("status", "--json").stdout)
    assert report["done"] == 5 and report["prompts"] == 5
    auth = ("fleet", "secret")
    wait_until(lambda: worker_online(flower, f"w1@{socket.gethostname()}"), 60, "worker online in Flower", sfleet)
    queues = httpx.get(f"{flower}/api/queues/length", auth=auth, timeout=10)
    assert queues.status_code == 200
    assert {q["name"]: q["messages"] for q in queues.json()["active_queues"]}.get("fleet.generate") == 0
