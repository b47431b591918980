"""Exactly one place, even across a death between the shard and the ledger.

A worker that dies after its group's shard is linked into place but before the
group is marked done leaves durable samples whose prompts are still queued. The
death is brought about from outside the worker (`die_between_link_and_done`):
Redis stops taking writes while the group is being written, so the worker's
mark-done call waits, and the worker is SIGKILLed once the shard has its final
name. So the death lands in that window every time it is tried.
"""
from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import redis

from contract.keys import RunKeys
from contract.ledger.ledger import Ledger, shard_code
from contract.storage.local import shard_files

from conftest import varied_prompts, write_prompts
from waiting import wait_until
from producer.local import Process

N = 24
LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}
GROUP_WAIT = 20  # seconds a group waits for its commit: time to generate every prompt and pause Redis


# The fault is staged at Redis (writes paused until the group's HSET waits there): the worker's
# short calls share a pool of 2 connections by default, which its heartbeat and lease writes, paused
# too, can both hold, leaving the HSET waiting in the worker for a connection instead.
POOL = {"FLEET_REDIS_CONNECTIONS": "8"}


def test_a_sample_stored_just_before_its_worker_died_is_not_generated_again(fleet, tmp_path):
    # Given a worker that commits one group of all N prompts and dies right after linking its shard
    _, url = fleet.standin("--step-base", "0.002")
    victim = fleet.worker("victim", [url], FLEET_SHARD_MAX_ROWS="1000", FLEET_SHARD_MAX_WAIT=str(GROUP_WAIT),
                          **LEASE, **POOL)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(N))))
    wait_until(lambda: len(httpx.get(f"{url}/standin/stats").json()["generations"]) == N, 120,
               "every prompt generated, its sample waiting for the group commit", fleet)
    die_between_link_and_done(victim, fleet.output_dir / "default", redis.Redis.from_url(fleet.redis_url))
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
    # and each dead worker's message came back once (kombu's restore; the audit took none for lost),
    # so each prompt was found once
    assert reconciled_ids(survivor.log.read_text()) == pids
    assert not republished_by_audit(survivor.log.read_text())
    assert not redis.Redis.from_url(fleet.redis_url).exists(RunKeys("default").writing)
    assert fleet.dead_letters() == []

    # and export holds each id once
    fleet.producer("export", str(tmp_path / "export"))
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    exported = [i for f in manifest["files"]
                for i in pq.read_table(tmp_path / "export" / f["name"], columns=["id"]).column("id").to_pylist()]
    assert sorted(exported) == pids


def die_between_link_and_done(worker: Process, folder: Path | None, client: redis.Redis, run: str = "default",
                              shards=None) -> None:
    """SIGKILL `worker` after its group's shard has its final name, before the group is marked done.

    The group commit's steps are: note the group's writing entries (one HSET), write and link
    the shard, mark the group done (a script). Redis is made to hold the worker at each step:
    1. Redis takes no writes (`CLIENT PAUSE ... WRITE`) while the group waits for its commit,
       until the worker's HSET of the writing entries waits on it;
    2. the worker is frozen (SIGSTOP, every thread stopped) and Redis takes writes again until
       the entries are recorded, then no more; the frozen worker has not yet read the reply;
    3. the worker goes on: it writes and links the shard, and its mark-done call waits on Redis;
    4. once the final name exists the worker is SIGKILLed, and Redis takes writes again once it
       has dropped the dead worker's connections, so the waiting call dies with them.
    """
    shards = shards or (lambda: shard_files(folder.parent, run))  # in a bucket: its listing
    writing = RunKeys(run).writing
    pause = ("CLIENT", "PAUSE", 120_000, "WRITE")
    client.execute_command(*pause)
    try:
        assert not client.exists(writing) and not (_entries(folder) if folder else shards()), \
            "the commit began before Redis paused"
        wait_until(lambda: _waiting(client, "hset"), 60, "the worker's writing entries waiting on Redis")
        os.kill(worker.popen.pid, signal.SIGSTOP)
        wait_until(lambda: _stopped(worker.popen.pid), 10, "every thread of the worker stopped")
        client.execute_command("CLIENT", "UNPAUSE")
        wait_until(lambda: client.hlen(writing) == N, 10, "the group's writing entries recorded")
        client.execute_command(*pause)
        os.kill(worker.popen.pid, signal.SIGCONT)
        wait_until(shards, 60, "the shard linked into place")
        worker.kill()
        assert worker.popen.returncode == -signal.SIGKILL
        wait_until(lambda: len(client.client_list()) == 1, 30, "Redis dropped the dead worker's connections")
    finally:
        client.execute_command("CLIENT", "UNPAUSE")


def reconciled_ids(log: str) -> list[str]:
    """The prompts a worker's log says it found stored and marked done rather than generated, once
    per time it said so (sorted): a prompt whose message came back twice after its worker's death
    would be named twice."""
    return sorted(re.findall(r"prompt (\S+): its sample was stored in \S+ just before its worker died", log))


def republished_by_audit(log: str) -> bool:
    """Whether a worker's log says its lost-message audit republished a prompt."""
    return "audit: republished" in log


def _waiting(client: redis.Redis, command: str) -> bool:
    """A connection's `command` is held by the pause (blocked, `b`, with that command pending)."""
    return any("b" in c["flags"] and c["cmd"] == command for c in client.client_list())


def _entries(folder: Path) -> list[str]:
    return os.listdir(folder) if folder.exists() else []


def _stopped(pid: int) -> bool:
    """Every thread of the process is stopped (state T in /proc)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as stat:
            states.append(stat.read().rsplit(")", 1)[1].split()[0])
    return all(state in ("T", "t") for state in states)
