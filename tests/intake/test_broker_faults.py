"""Broker faults: cut connections, SIGTERM with samples still committing, poison prompts, a Redis that forgets.

Each test runs real processes (redis-server, stand-ins, `celery -A workers worker`) and checks what a
user would: the stand-in's generation count per prompt, the ids in the shards, the dead letters.
"""
from __future__ import annotations

import signal
import time
from collections import Counter

import httpx
import redis

from contract.ledger import deliveries
from contract.broker import kombu_redis
from contract.keys import RunKeys
from contract.ledger.ledger import Ledger, locate
from producer.local import free_port, start_redis
from sglang_standin.cli import parse_config
from sglang_standin.outputs import fault_for

from conftest import messages_of, render, varied_prompts, write_prompts
from waiting import stop_broker, wait_until

LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1",
         "FLEET_CONCURRENCY": "32", "FLEET_MAX_INFLIGHT_PER_SERVER": "32"}
RUN = RunKeys("default")


def _generations(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]


def _consumers(client: redis.Redis) -> int:
    """Broker connections blocked on a queue: one per consuming worker."""
    return sum(1 for c in client.client_list() if c.get("cmd") == "brpop")


def _stored_once(fleet, ids: set[str]) -> None:
    counts = Counter(r["id"] for r in fleet.rows())
    assert set(counts) == ids and set(counts.values()) == {1}, counts


def _sixteen_in_flight(fleet, tmp_path, slow_seconds: int, own_broker: bool = False) -> tuple[str, list, object]:
    """Given two workers (on a Redis of the test's own with append-only persistence, if
    `own_broker`), and 16 generations far longer than the lease, all in flight: the stand-in's URL,
    the workers and the broker process (None unless `own_broker`)."""
    _, url = fleet.standin("--fault-slow", "1", "--slow-seconds", str(slow_seconds))
    broker = None
    if own_broker:
        broker, fleet.redis_url = start_redis(fleet.logs, port=free_port(), data_dir=tmp_path / "redis-data",
                                              appendonly=True)
        fleet.processes.append(broker)
    workers = [fleet.worker("w1", [url], **LEASE), fleet.worker("w2", [url], **LEASE)]
    wait_until(lambda: _consumers(redis.Redis.from_url(fleet.redis_url)) >= 2, 90, "both workers consuming", fleet)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(16))))
    wait_until(lambda: len(_generations(url)) == 16, 60, "16 generations in flight", fleet)
    return url, workers, broker


def _each_generated_and_stored_once(fleet, url: str) -> None:
    """Then every prompt is stored exactly once, and each was generated exactly once."""
    ids = {f"p-{i:04d}" for i in range(16)}
    assert fleet.wait_finished(timeout=240) == {"done": 16}
    assert _generations(url) == {pid: 1 for pid in ids}
    _stored_once(fleet, ids)
    assert fleet.dead_letters() == []


def test_a_cut_broker_connection_never_starts_a_generation_twice(fleet, tmp_path):
    url, _, _ = _sixteen_in_flight(fleet, tmp_path, slow_seconds=25)

    # When Redis drops every worker connection, twice in a row (each time once both are consuming again)
    client = redis.Redis.from_url(fleet.redis_url)
    for _ in range(2):
        client.execute_command("CLIENT", "KILL", "TYPE", "normal")
        wait_until(lambda: _consumers(client) >= 2, 60, "both workers back", fleet)

    _each_generated_and_stored_once(fleet, url)


def test_a_redis_restart_never_starts_a_generation_twice(fleet, tmp_path):
    url, workers, broker = _sixteen_in_flight(fleet, tmp_path, slow_seconds=20, own_broker=True)

    # When Redis stops while they run, on a machine too busy to run them for 3 s (their event loops'
    # timers, the restore sweep's every second, are due when they go on: each one's Redis call meets
    # Redis gone), and, once both workers have noticed, restarts on the same port and data
    stop_broker(broker, workers, fleet, busy=3.0)
    port = int(fleet.redis_url.rsplit(":", 1)[1].split("/")[0])
    broker, _ = start_redis(fleet.logs, port=port, data_dir=tmp_path / "redis-data", appendonly=True)
    fleet.processes.append(broker)

    _each_generated_and_stored_once(fleet, url)


def test_a_redis_frozen_longer_than_a_lease_never_starts_a_generation_twice(fleet, tmp_path):
    url, _, broker = _sixteen_in_flight(fleet, tmp_path, slow_seconds=25, own_broker=True)

    # When Redis freezes (SIGSTOP: its connections open, nothing answered) for longer than a lease,
    # then goes on: on its clock every lease has lapsed, and every worker's calls meet it at once
    broker.signal(signal.SIGSTOP)
    try:
        time.sleep(12)  # the fault's length (the lease is 8 s), not a synchronisation
    finally:
        broker.signal(signal.SIGCONT)

    _each_generated_and_stored_once(fleet, url)


def _slow_prompts(records: list[dict], tokenizer, standin: list[str]) -> set[str]:
    """The prompts the stand-in makes slow (its faults are deterministic by prompt)."""
    cfg = parse_config(["--port", "1", *standin])
    return {r["id"] for r in records if fault_for(render(tokenizer, messages_of(r)), cfg) == "slow"}


def test_sigterm_keeps_every_sample_finished_before_the_grace_ends(fleet, tokenizer, tmp_path):
    # Given a worker whose group commit waits far longer than its shutdown grace, and prompts of
    # which some generate quickly and the others outlast the grace
    standin = ["--step-base", "0.01", "--fault-slow", "0.3", "--slow-seconds", "20"]
    _, url = fleet.standin(*standin)
    records = varied_prompts(24)
    slow = _slow_prompts(records, tokenizer, standin)
    assert 0 < len(slow) < 24
    worker = fleet.worker("w1", [url], FLEET_SHUTDOWN_GRACE="4", FLEET_SHARD_MAX_WAIT="120", **LEASE)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))

    def quick_ones_answered() -> bool:
        stats = httpx.get(f"{url}/standin/stats", timeout=10).json()
        return len(stats["generations"]) == 24 and stats["running"] == 0 and stats["waiting"] == 0
    wait_until(quick_ones_answered, 90, "every quick generation answered", fleet)
    answered = {r["id"] for r in records} - slow

    # When it gets SIGTERM while those samples wait for their shard
    worker.signal(signal.SIGTERM)

    # Then it exits 0 with every sample it finished in a shard, acknowledged: only the prompts it
    # was still generating are back in the queue, and nothing is left in flight
    assert worker.popen.wait(90) == 0
    by_w1 = {r["id"] for r in fleet.rows() if r["worker"].startswith("w1@")}
    assert answered <= by_w1
    client = redis.Redis.from_url(fleet.redis_url)
    queued = [m["headers"]["id"].split(":", 1)[1] for m in kombu_redis.queued_messages(client, "fleet.generate")]
    assert sorted(queued) == sorted(slow - by_w1)
    assert client.hlen(kombu_redis.UNACKED) == 0

    # and once another worker has finished the rest, nothing finished was generated again
    fleet.worker("w2", [url], **LEASE)
    assert fleet.wait_finished(timeout=240) == {"done": 24}
    generations = _generations(url)
    assert all(generations[pid] == 1 for pid in by_w1), generations
    assert all(generations[pid] <= 2 for pid in slow), generations
    _stored_once(fleet, {r["id"] for r in records})


def test_a_prompt_whose_deliveries_keep_dying_with_their_worker_ends_as_a_poison_dead_letter(
        fleet, tokenizer, tmp_path):
    # Given a prompt whose generation never ends (each worker holding it will be killed), beside good
    # ones that take a few seconds, and workers that allow one unfinished delivery of a prompt
    standin = ["--fault-slow", "0.2", "--slow-seconds", "3600", "--step-base", "0.05", "--output-len-max", "64"]
    _, url = fleet.standin(*standin)
    candidates = varied_prompts(30)
    slow = _slow_prompts(candidates, tokenizer, standin)
    hanging = sorted(slow)[0]
    records = [r for r in candidates if r["id"] == hanging] + [r for r in candidates if r["id"] not in slow][:4]
    good = {r["id"] for r in records} - {hanging}
    client = redis.Redis.from_url(fleet.redis_url)
    env = {"FLEET_MAX_DELIVERIES": "1", **LEASE}

    def holders(pid: str) -> list[str]:
        return deliveries.names(client.hget(RUN.deliveries, pid))

    # When each worker that starts it is SIGKILLed at once (the first with good prompts in flight beside
    # it), and replaced
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    for started, name in enumerate(("w1", "w2"), start=1):
        worker = fleet.worker(name, [url], **env)
        # its delivery is noted before its request reaches the server: wait for both
        wait_until(lambda: any(h.startswith(f"{name}@") for h in holders(hanging)[-1:])
                    and _generations(url).get(hanging, 0) >= started, 120, f"{name} runs it", fleet)
        worker.signal(signal.SIGKILL)
        worker.popen.wait(10)
        if name == "w1":
            bystanders = {pid for pid in good if holders(pid)}
    fleet.worker("w3", [url], **env)

    # Then it is a poison dead letter naming both workers, generated twice and never a third time,
    # and every other prompt is stored, bystanders of its deaths included
    assert fleet.wait_finished(timeout=300) == {"done": 4, "dead": 1}
    (letter,) = fleet.dead_letters()
    assert letter["id"] == hanging and letter["reason"] == "poison"
    assert [w.split("@")[0] for w in letter["excerpt"]["held_by"]] == ["w1", "w2"]
    assert "w1@" in letter["message"] and "w2@" in letter["message"]
    assert _generations(url)[hanging] == 2
    _stored_once(fleet, good)
    assert bystanders and client.hlen(RUN.deliveries) == 0


def test_a_prompt_redis_has_forgotten_becomes_a_dead_letter_that_says_so(fleet, tmp_path):
    # Given a queued run of which Redis has lost one prompt's ids and state (evicted, flushed)
    _, url = fleet.standin()
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(6))))
    client = redis.Redis.from_url(fleet.redis_url)
    bucket, field = locate("p-0002")
    assert client.hdel(RUN.state_bucket(bucket), field) == 1 and client.hdel(RUN.token_ids, "p-0002") == 1

    # When a worker takes the run's messages
    fleet.worker("w1", [url])

    # Then the forgotten prompt is a dead letter that says Redis forgot it, and the others are stored
    wait_until(lambda: Ledger(client, "default").state("p-0002") is not None, 120,
                "the forgotten prompt back in the ledger", fleet)
    assert fleet.wait_finished() == {"done": 5, "dead": 1}
    (letter,) = fleet.dead_letters()
    assert letter["id"] == "p-0002" and letter["reason"] == "worker_error"
    assert "forgotten" in letter["message"] and "noeviction" in letter["message"]
    _stored_once(fleet, {f"p-{i:04d}" for i in range(6)} - {"p-0002"})

    # And replaying it publishes no empty prompt: the letter stays, and the producer says why
    replay = fleet.producer("dead", "requeue", "--yes")
    assert "requeued 0 prompts" in replay.stdout and "hold no token ids" in replay.stderr
    assert [d["id"] for d in fleet.dead_letters()] == ["p-0002"] and fleet.states()["dead"] == 1


def test_a_worker_warns_at_start_when_redis_may_forget_or_cannot_be_checked(fleet):
    # Given Redis without persistence that evicts keys under memory pressure, and a Redis user
    # that may not read the configuration (as on managed Redis)
    _, url = fleet.standin()
    client = redis.Redis.from_url(fleet.redis_url)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.execute_command("ACL", "SETUSER", "limited", "on", ">secret", "~*", "&*", "+@all", "-config")
    limited_url = fleet.redis_url.replace("redis://", "redis://limited:secret@")

    # When a worker starts on each
    first = fleet.worker("w1", [url])
    second = fleet.worker("w2", [url], REDIS_URL=limited_url)

    # Then the first says, in one line, what Redis may forget, and the second that it could not check
    def line(worker, text: str) -> list[str]:
        return [ln for ln in worker.log.read_text().splitlines() if text in ln]
    wait_until(lambda: line(first, "may forget work") and line(second, "could not check"), 90,
                "the start-up warnings", fleet)
    (warning,) = line(first, "may forget work")
    assert "allkeys-lru" in warning and "no persistence" in warning
    (refused,) = line(second, "could not check")
    assert "secret" not in refused and "noeviction" in refused
