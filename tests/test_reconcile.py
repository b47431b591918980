"""Exactly one place, even across a death between the shard and the ledger.

A worker that dies after its group's shard is linked into place but before the
group is marked done leaves durable samples whose prompts are still queued. The
fault is injected by the test hook `FLEET_FAULT_AFTER_LINK=1` (the worker exits
137 right after linking a shard, as if SIGKILLed there), so the death lands in
that window every time.
"""
from __future__ import annotations

import json

import httpx
import pyarrow.parquet as pq
import redis

from contract.keys import RunKeys
from contract.ledger import Ledger, shard_code
from contract.schema import shard_files

from conftest import varied_prompts, write_prompts

N = 24
LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}


def test_a_sample_stored_just_before_its_worker_died_is_not_generated_again(fleet, tmp_path):
    # Given a worker that commits one group of all N prompts and dies right after linking its shard
    _, url = fleet.standin("--step-base", "0.002")
    victim = fleet.worker("victim", [url], FLEET_FAULT_AFTER_LINK="1", FLEET_SHARD_MAX_ROWS=str(N),
                          FLEET_SHARD_MAX_WAIT="120", **LEASE)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(N))))
    assert victim.popen.wait(180) == 137, victim.tail()
    (shard,) = shard_files(fleet.output_dir, "default")
    assert sorted(pq.read_table(shard, columns=["id"]).column("id").to_pylist()) == [
        f"p-{i:04d}" for i in range(N)]
    assert fleet.states() == {"queued": N}  # durable, not yet marked done
    assert httpx.get(f"{url}/standin/stats").json()["generations"].__len__() == N

    # When another worker takes the prompts up once the dead worker's leases run out
    survivor = fleet.worker("survivor", [url], **LEASE)
    assert fleet.wait_finished(timeout=180) == {"done": N}

    # Then no prompt was generated again: each was found in the dead worker's shard, which
    # the ledger names as its canonical copy, and no second shard was written
    generations = httpx.get(f"{url}/standin/stats").json()["generations"]
    assert len(generations) == N and set(generations.values()) == {1}
    pids = [f"p-{i:04d}" for i in range(N)]
    assert {e.shard for e in Ledger(redis.Redis.from_url(fleet.redis_url), "default").entries(pids)} == {
        shard_code(shard)}
    assert shard_files(fleet.output_dir, "default") == [shard]
    assert survivor.log.read_text().count("not generated again") == N
    assert not redis.Redis.from_url(fleet.redis_url).exists(RunKeys("default").writing)
    assert fleet.dead_letters() == []

    # and export holds each id once
    fleet.producer("export", str(tmp_path / "export"))
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    exported = [i for f in manifest["files"]
                for i in pq.read_table(tmp_path / "export" / f["name"], columns=["id"]).column("id").to_pylist()]
    assert sorted(exported) == pids
