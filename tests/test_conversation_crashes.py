"""Conversations through a worker's SIGKILL and then Redis's, run after run: no turn generated twice.

The field report (issue 43): 300 conversations (`--turns all`), two workers,
one SIGKILLed at a quarter of the run, Redis (`appendfsync always`) SIGKILLed
at 55% and restarted on its data: a turn was generated twice, once in three
runs. So this runs the same faults `FLEET_TEST_CRASH_RUNS` times (1) over
`FLEET_TEST_CRASH_CONVERSATIONS` conversations each (60: the race needs turns
in every step of their path at the faults, not a long run; the field report's
size is 300 conversations, ten runs), each run on its own Redis, stand-in and
workers; Redis stays down `FLEET_TEST_CRASH_DOWN` seconds (0: restarted as
soon as the survivor noticed; longer than a heartbeat's life, 8 s here, its
heartbeat is gone when Redis comes back).

A turn may be generated again only where its earlier generation could not be
stored: the killed worker's (in flight when it died, or generated and waiting
for its group commit), or one whose commit the Redis crash cut. So each
generation the stand-in started (its `spans`: start and end) is matched to
the turn's one stored row (its worker's `started_at`, `finished_at`), and an
unstored one is by design only if it began before the kill and the killed
worker held the turn then, or it ended within the Redis outage; and it must
have ended before the stored one began. Any other (a generation beside a live
one, or after the turn was stored) is a real double, and fails the test with
what the survivor logged of it. Every turn is stored once, every conversation
completes, nothing is dead-lettered.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import redis

from contract.keys import RunKeys
from producer.local import free_port, start_redis

from conftest import Fleet, write_prompts
from test_conversations import conversations
from waiting import broker_losses, wait_until

LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}
RUNS = int(os.environ.get("FLEET_TEST_CRASH_RUNS", "1"))
COUNT = int(os.environ.get("FLEET_TEST_CRASH_CONVERSATIONS", "60"))
DOWN = float(os.environ.get("FLEET_TEST_CRASH_DOWN", "0"))
SLACK = 1.0  # seconds: a worker's timestamps around the stand-in's (the same host's clock)
NOTICED = 5.0  # seconds: the stand-in notices a client gone within its 4 s poll


def _counters(client: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(RunKeys("default").counters).items()}


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()


def _one_run(fleet: Fleet, tmp: Path) -> dict:
    """Given Redis with `appendfsync always`, a stand-in, two workers and COUNT conversations;
    when one worker is SIGKILLed at a quarter of the turns and Redis at 55%, restarted on its
    data (after DOWN seconds): what the test saw."""
    _, url = fleet.standin("--step-base", "0.01", "--output-len-median", "60")
    data, port = tmp / "redis-data", free_port()
    broker, fleet.redis_url = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True, fsync="always")
    fleet.processes.append(broker)
    victim = fleet.worker("victim", [url], **LEASE)
    survivor = fleet.worker("survivor", [url], **LEASE)
    records = conversations(COUNT)
    turns = sum(2 + i % 3 for i in range(COUNT))
    fleet.producer("enqueue", str(write_prompts(tmp / "c.jsonl", records)), "--turns", "all",
                   "--max-new-tokens", "1024")
    client = redis.Redis.from_url(fleet.redis_url)

    wait_until(lambda: _counters(client).get("state:done", 0) >= turns // 4, 180, "a quarter of the turns", fleet)
    generating_at_kill = set(_stats(url)["generating"])
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.popen.wait(30)
    held = {pid.decode() for pid, names in client.hgetall(RunKeys("default").deliveries).items()
            if b"victim@" in names}

    wait_until(lambda: _counters(client).get("state:done", 0) >= turns * 55 // 100, 240, "55% of the turns", fleet)
    generating_at_crash = set(_stats(url)["generating"])
    losses = broker_losses([survivor])
    crashed_at = time.time()
    broker.kill()  # SIGKILL
    wait_until(lambda: broker_losses([survivor]) > losses, 60, "the survivor to notice Redis is gone", fleet)
    time.sleep(max(0.0, crashed_at + DOWN - time.time()))
    broker, _ = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True, fsync="always")
    back_at = time.time()
    fleet.processes.append(broker)

    wait_until(lambda: _counters(client).get("conversations_complete", 0) == COUNT, 400,
               "every conversation complete", fleet, poll=0.5)
    stats = _stats(url)
    rows = fleet.rows()
    return {"turns": turns, "held": held, "generating_at_kill": generating_at_kill,
            "generating_at_crash": generating_at_crash, "generations": stats["generations"],
            "spans": stats["spans"], "killed_at": killed_at, "crashed_at": crashed_at, "back_at": back_at,
            "rows": {r["id"]: r for r in rows}, "stored": Counter(r["id"] for r in rows),
            "states": fleet.states(), "dead": fleet.dead_letters(), "log": survivor.log}


def _stamp(value) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def doubles(seen: dict) -> tuple[dict[str, str], dict[str, str]]:
    """Each turn generated more than once -> why each generation but the stored one was made:
    (by design, real doubles). A generation that was not stored is by design where it could not
    be: the killed worker's (begun before the kill, the turn noted for it then), or one whose
    group commit the Redis outage cut (answered from a little before the crash to the restart),
    and it ended before the stored one began. Anything else (beside a live generation, or after
    the stored one) is a real double."""
    by_design, real = {}, {}
    for pid, spans in seen["spans"].items():
        row = seen["rows"][pid]
        begun, ended = _stamp(row["started_at"]), _stamp(row["finished_at"])
        stored = [s for s in spans if s[0] >= begun - SLACK and s[1] is not None and s[1] <= ended + SLACK]
        if seen["stored"][pid] != 1 or not stored:
            real[pid] = f"stored {seen['stored'][pid]} times; generations {spans}, row {begun:.2f}-{ended:.2f}"
            continue
        first = stored[-1]  # the stored one; any earlier in its row's time, its delivery's own retries
        why = ["retried by the delivery that stored it"] * (len(stored) - 1)
        for start, end in spans:
            if [start, end] in stored:
                continue
            end = end if end is not None else float("inf")
            before = end <= first[0] + (NOTICED if start < seen["killed_at"] else SLACK)
            victims = start < seen["killed_at"] and pid in seen["held"]
            cut = seen["crashed_at"] - 2 * SLACK <= end <= seen["back_at"] + NOTICED
            if before and (victims or cut):
                why.append("the killed worker's" if victims else "its commit cut by the Redis crash")
            else:
                real[pid] = (f"generated {start:.2f}-{end:.2f} beside the stored one {first[0]:.2f}-{first[1]:.2f} "
                             f"(kill {seen['killed_at']:.2f}, crash {seen['crashed_at']:.2f}, "
                             f"back {seen['back_at']:.2f}; held by the killed worker: {pid in seen['held']})")
                break
        else:
            by_design[pid] = "; ".join(why)
    return by_design, real


def test_conversations_through_a_worker_kill_and_a_redis_crash_generate_no_turn_twice_run_after_run(
        tmp_path, tokenizer):
    expected = {f"{r['id']}#{t}" for r in conversations(COUNT) for t in range(2 + int(r["id"][2:]) % 3)}
    problems = []
    for run in range(RUNS):
        tmp = tmp_path / f"run-{run}"
        fleet = Fleet(tmp, "")
        try:
            seen = _one_run(fleet, tmp)
        finally:
            fleet.stop()

        # Then every turn is stored once, every conversation is complete, nothing is dead-lettered
        assert seen["states"] == {"done": seen["turns"]} and seen["dead"] == []
        assert set(seen["stored"]) == expected
        # And a turn is generated again only where its earlier generation could not be stored
        by_design, real = doubles(seen)
        print(f"\nrun {run}: held at kill {len(seen['held'])}, down {seen['back_at'] - seen['crashed_at']:.1f}s; "
              f"generated again by design {len(by_design)} ({Counter(by_design.values())}), "
              f"real doubles {sorted(real)}")
        if real:
            lines = [ln for ln in seen["log"].read_text(errors="replace").splitlines() if any(p in ln for p in real)]
            problems.append((run, real, lines[-20:]))
    assert problems == [], problems


def test_a_turn_a_live_worker_generates_is_not_generated_again_when_its_heartbeat_expired_in_a_redis_outage(
        fleet, tmp_path):
    """A Redis outage longer than a heartbeat's life: when Redis comes back, a live worker's
    heartbeat is gone until its next write, and a second message of a turn it generates, taken
    by another worker then, finds the turn's note naming a worker with no heartbeat at all."""
    from contract.broker.config import celery_app
    from contract.broker.publish import publish_prompts
    from contract.keys import DEFAULT_QUEUE
    from contract.run.spec import run_queues
    from contract.fleet import heartbeats
    from netfault import NetFault

    env = {"FLEET_HEALTH_TIMEOUT": "10"}  # a heartbeat lives 3 health rounds + 10 s: 13 s
    # Given a conversation whose first turn takes long, generating on w1 (which reaches Redis
    # through a proxy), and w2 idle beside it
    _, url = fleet.standin("--fault-slow", "1", "--slow-seconds", "40")
    data, port = tmp_path / "redis-data", free_port()
    broker, fleet.redis_url = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True, fsync="always")
    fleet.processes.append(broker)
    proxy = NetFault(port)
    w1 = fleet.worker("w1", [url], REDIS_URL=proxy.url, **env)
    messages = [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
                {"role": "user", "content": "And another?"}]
    fleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", [{"id": "c-0000", "messages": messages}])),
                   "--turns", "all")
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: _stats(url)["generating"], 90, "w1 generating the first turn", fleet)
    (turn,) = _stats(url)["generating"]
    fleet.worker("w2", [url], **env)
    wait_until(lambda: {r["worker"].split("@")[0] for r in heartbeats.read_all(client)} == {"w1", "w2"}, 90,
               "both workers' heartbeats", fleet)

    # When Redis is SIGKILLed and stays down past the heartbeat's life (15 s), and a second message
    # of the turn reaches w2 once its consumer is back, while w1's writes still back off (held by
    # the network until w2 has taken it)
    proxy.hold_all()
    broker.kill()
    time.sleep(15)
    broker, _ = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True, fsync="always")
    fleet.processes.append(broker)
    assert [r for r in heartbeats.read_all(client) if r["worker"].startswith("w1@")] == []
    wait_until(lambda: any(c.get("cmd") == "brpop" for c in client.client_list()), 60, "w2 consuming", fleet)
    (queue,) = run_queues(client, DEFAULT_QUEUE).values()
    publish_prompts(celery_app(fleet.redis_url, queue=queue), "default", queue, [(turn, 3, None)])
    wait_until(lambda: b"w2@" in (client.hget(RunKeys("default").deliveries, turn) or b""), 60,
               "w2 taking the second message", fleet)
    time.sleep(1)
    proxy.release()

    # Then the turn is generated once, by w1, and stored once; the conversation completes
    wait_until(lambda: _counters(client).get("conversations_complete", 0) == 1, 180, "the conversation", fleet)
    stats = _stats(url)
    assert stats["generations"][turn] == 1 and stats["requests"] == 2, w1.tail(40)  # one request a turn
    assert Counter(r["id"] for r in fleet.rows())[turn] == 1
    assert fleet.dead_letters() == []
