"""Redis that refuses writes says so, and the fleet goes on by itself once it takes them again.

Real redis-server, stand-in and `celery -A workers worker` processes. Redis is
made to refuse writes the three ways production does: out of memory under
`noeviction` (`CONFIG SET maxmemory`), read-only (`REPLICAOF` a primary that
is not there) and too few replicas (`min-replicas-to-write 1` with none).
"""
from __future__ import annotations

import base64
import json
import time

import pytest
import redis

from contract.redis_link import retries
from contract.redis_link.connections import client_for
from contract.keys import RunKeys
from contract.ledger.ledger import Ledger
from producer.local import free_port

from conftest import varied_prompts, write_prompts
from waiting import wait_until

QUEUE = "fleet.generate"
SLOW = ("--step-base", "0.02", "--output-len-max", "100")  # about two seconds a generation
FEW_AT_A_TIME = {"FLEET_CONCURRENCY": "4", "FLEET_MAX_INFLIGHT_PER_SERVER": "4", "FLEET_SHARD_MAX_WAIT": "0.2"}

# Each refusal: (how Redis is made to refuse, how it is restored, words the one line must hold)
REFUSALS = {
    "out of memory": (lambda r: r.config_set("maxmemory", 1), lambda r: r.config_set("maxmemory", 0),
                      ("out of memory", "OOM command not allowed", "raise maxmemory")),
    "read-only": (lambda r: r.execute_command("REPLICAOF", "127.0.0.1", free_port()),
                  lambda r: r.execute_command("REPLICAOF", "NO", "ONE"),
                  ("read-only", "READONLY", "point it at the primary")),
    "no replicas": (lambda r: r.config_set("min-replicas-to-write", 1),
                    lambda r: r.config_set("min-replicas-to-write", 0),
                    ("no replicas", "NOREPLICAS", "min-replicas-to-write")),
}


def queued_messages(client: redis.Redis) -> list[str]:
    """The prompt ids of the messages waiting in the queue."""
    ids = []
    for raw in client.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        ids.append(json.loads(body)[0][1])
    return ids


def one_place(fleet, records) -> None:
    """Every prompt stored once, none dead, and the ledger's counts add up."""
    ids = sorted(row["id"] for row in fleet.rows())
    assert ids == sorted(r["id"] for r in records)
    assert fleet.dead_letters() == []
    assert fleet.counters()["enqueued"] == len(records)


@pytest.mark.parametrize("kind", REFUSALS)
def test_enqueue_into_a_redis_that_refuses_writes_stops_with_one_line_and_publishes_nothing_unrecorded(
        fleet, tmp_path, kind):
    refuse, restore, words = REFUSALS[kind]
    client = redis.Redis.from_url(fleet.redis_url)
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(40))

    # Given Redis refusing writes
    refuse(client)

    # When prompts are enqueued
    result = fleet.producer("enqueue", str(prompts), check=False)

    # Then enqueue stops with one line that names the cause and the remedy, no traceback, and
    # nothing is published
    assert result.returncode == 3, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.stderr
    assert "Traceback" not in result.stderr
    assert queued_messages(client) == []

    # and once writes are accepted again, the same command enqueues every prompt once
    restore(client)
    fleet.producer("enqueue", str(prompts))
    assert sorted(queued_messages(client)) == sorted(f"p-{i:04d}" for i in range(40))


def test_enqueue_running_into_maxmemory_midway_publishes_only_what_it_recorded(fleet, tmp_path):
    # Given Redis with room for only part of a large prompt file, beyond the fleet's Lua scripts
    # (~80 KB, which the fleet's clients load when they connect: a producer's first connection
    # would otherwise take them from the room)
    client = redis.Redis.from_url(fleet.redis_url)
    client_for(fleet.redis_url, retry=retries.shared()).ping()
    records = varied_prompts(3000)
    prompts = write_prompts(tmp_path / "p.jsonl", records)
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 800_000)

    # When it is enqueued
    result = fleet.producer("enqueue", str(prompts), check=False)

    # Then enqueue stops with the one line, and every published message is of a prompt the ledger holds
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert "OOM command not allowed" in result.stderr
    published = queued_messages(client)
    states = Ledger(client, "default").states(published)
    assert published and all(state == "queued" for state in states)
    assert len(published) < len(records)

    # and with the memory raised, the same enqueue again records every prompt once
    client.config_set("maxmemory", 0)
    fleet.producer("enqueue", str(prompts))
    assert len(set(queued_messages(client))) <= len(records)
    assert fleet.counters()["enqueued"] == len(records)


@pytest.mark.parametrize("kind", REFUSALS)
def test_a_worker_pauses_while_redis_refuses_writes_and_goes_on_by_itself(fleet, tmp_path, kind):
    refuse, restore, words = REFUSALS[kind]
    client = redis.Redis.from_url(fleet.redis_url)
    # Given a worker generating a run of 30 prompts, a few at a time
    _, url = fleet.standin(*SLOW)
    worker = fleet.worker("w1", [url], **FEW_AT_A_TIME)
    records = varied_prompts(30)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    wait_until(lambda: fleet.states().get("done", 0) >= 4, 120, "first samples", fleet)

    # When Redis refuses writes for a while
    refuse(client)
    wait_until(lambda: "Redis refuses writes" in worker.log.read_text(), 60, "the worker to see the refusal", fleet)
    log = worker.log.read_text()
    assert all(w in log for w in words[:2])
    time.sleep(5)  # the refusal lasts: the worker had its chance to misbehave (the line above is the signal)

    # Then, once writes are accepted again, the worker goes on by itself (never restarted): every
    # prompt stored once, none dead, the counts add up
    restore(client)
    assert fleet.wait_finished(timeout=240) == {"done": 30}
    one_place(fleet, records)
    assert worker.alive() and worker.log.read_text().count(" ready.") == 1
    assert client.hlen(RunKeys("default").counters) > 0
