"""Costs flat in the size of the run, checked with real processes.

Two producers started on one file publish each prompt once (the ledger's
set-if-absent says which prompts are new: no producer keeps a set of ids);
`status` and `dead stats` send the same Redis commands whatever the run's
size; dead letters are listed, replayed and purged page by page.
"""
from __future__ import annotations

import json
from collections import Counter

import httpx
import redis

from conftest import varied_prompts, write_prompts
from contract.ledger.codec import ids_to_b64, pack_ids
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.broker.kombu_redis import queue_depth
from contract.ledger.ledger import Ledger
from contract.redis_link import clock

INSTANT = ("--step-base", "0", "--step-per-request", "0", "--prefill-per-token", "0",
           "--output-len-median", "40", "--output-len-max", "60")
QUEUE = "fleet.generate"


def long_prompts(n: int, words: int = 600) -> list[dict]:
    """Prompts long enough that tokenizing a file of them takes seconds."""
    return [{"id": f"p-{i:04d}", "prompt": f"Question {i}: " + " ".join(f"w{(i * 7 + j) % 997}" for j in range(words))}
            for i in range(n)]


def _published(stdout: str) -> int:
    """The `published` figure of enqueue's summary table."""
    row = stdout.split("┡", 1)[1].splitlines()[1]
    return int(row.strip("│ ").split()[0].replace(",", ""))  # counts carry thousands separators


def test_two_producers_started_on_one_file_publish_each_prompt_once(fleet, tmp_path):
    # Given a file of 2,000 prompts (long enough that two producers run side by side)
    records = long_prompts(2000)
    path = write_prompts(tmp_path / "p.jsonl", records)

    # When two producers enqueue it at the same time, with no worker running yet
    producers = [fleet.start_producer("enqueue", str(path)) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in producers]
    assert [p.returncode for p in producers] == [0, 0], outputs
    assert sum(_published(stdout) for stdout, _ in outputs) == 2000

    # Then each prompt was published once: one message each, counted once by the ledger
    client = redis.Redis.from_url(fleet.redis_url)
    assert queue_depth(client, QUEUE) == 2000
    tally = Ledger(client, "default").tally()
    assert (tally.enqueued, tally.queued) == (2000, 2000)
    # and, once a worker drains the queue, each prompt was generated and stored once
    _, url = fleet.standin(*INSTANT)
    fleet.worker("w1", [url])
    assert fleet.wait_finished(timeout=600) == {"done": 2000}
    stored = Counter(row["id"] for row in fleet.rows())
    assert stored == Counter({r["id"]: 1 for r in records})
    assert httpx.get(f"{url}/standin/stats").json()["generations"] == {r["id"]: 1 for r in records}


def test_a_repeated_id_is_published_once_and_reported_with_its_line(fleet, tmp_path):
    # Given a file whose prompt p-0003 comes back 300 lines later (another batch), and
    # whose p-0005 comes back on the next line
    records = varied_prompts(400)
    records.insert(301, {"id": "p-0003", "prompt": "the same id, another prompt"})
    records.insert(6, {"id": "p-0005", "prompt": "the same id, another prompt"})
    path = write_prompts(tmp_path / "p.jsonl", records)

    # When it is enqueued with no worker running
    result = fleet.producer("enqueue", str(path))

    # Then each id is published once, and each repeat is reported as a duplicate with its line
    client = redis.Redis.from_url(fleet.redis_url)
    assert queue_depth(client, QUEUE) == 400 == Ledger(client, "default").tally().enqueued
    assert "line 7: duplicate id (first one kept): p-0005" in result.stderr
    assert "line 303: duplicate id (first one kept): p-0003" in result.stderr


def _fill(client: redis.Redis, run: str, prompts: int, dead_every: int = 0) -> None:
    """A run of `prompts` finished prompts, through the ledger's own transitions (as the
    workers make them); every `dead_every`-th is dead-lettered instead."""
    ledger, store = Ledger(client, run), DeadLetters(client, run)
    pids = [f"{run}-{i:06d}" for i in range(prompts)]
    with client.pipeline(transaction=False) as pipe:
        ledger.enqueue({p: pack_ids([5, 6, 7]) for p in pids}, 1, pipe)
        for i, pid in enumerate(pids):
            if not dead_every or i % dead_every:
                ledger.mark_done(pid, 10, f"part-{i // 100:05d}.parquet", pipe)
        pipe.execute()
    for i, pid in enumerate(pids):
        if dead_every and not i % dead_every:
            store.put(DeadLetter(id=pid, run=run, reason=("truncated", "aborted")[i // dead_every % 2],
                                 message="m", attempts=1, servers=[], worker="w", prompt_b64=ids_to_b64([5, 6, 7]),
                                 prompt_tokens=3, sampling={"max_new_tokens": 100}))


def _commands(client: redis.Redis) -> Counter:
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def test_status_and_dead_stats_send_the_same_commands_whatever_the_size_of_the_run(fleet, tmp_path):
    # Given a small run and a run 50 times larger, both with dead letters
    client = redis.Redis.from_url(fleet.redis_url)
    spec_path = write_prompts(tmp_path / "p.jsonl", varied_prompts(1))
    sent = {}
    for run, size in (("small", 100), ("large", 5000)):
        fleet.producer("enqueue", str(spec_path), "--run", run)  # the run's spec
        _fill(client, run, size, dead_every=10)

        # When status and dead stats are asked for
        before = _commands(client)
        status = json.loads(fleet.producer("status", "--json", "--run", run).stdout)
        stats = json.loads(fleet.producer("dead", "stats", "--json", "--run", run).stdout)
        sent[run] = _commands(client) - before - Counter(info=1)

        # Then they report the run's counts
        assert (status["done"], status["dead"], status["pending"]) == (size * 9 // 10, size // 10, 1)
        assert stats == {"aborted": size // 20, "truncated": size // 20}
    # and the Redis commands they sent are the same for both, none of them a scan; but for the readings of Redis's
    # clock, one more where a round trip was slow on a loaded machine (contract/redis_link/clock.py), whatever the size
    readings = {run: sent[run].pop("time", 0) for run in sent}
    assert sent["small"] == sent["large"]
    assert all(n <= 2 * clock.READINGS for n in readings.values()), readings
    assert not {"scan", "hscan", "hkeys", "hvals", "keys", "sscan", "zscan"} & set(sent["large"])


def test_dead_letters_are_listed_replayed_and_purged_page_by_page(fleet, tmp_path):
    # Given a run with 1,500 dead letters of two reasons (three pages of the store's scan)
    client = redis.Redis.from_url(fleet.redis_url)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(1))))
    _fill(client, "default", 1500, dead_every=1)
    assert queue_depth(client, QUEUE) == 1

    # When they are listed, in full and limited
    listed = fleet.dead_letters()
    first = json.loads(fleet.producer("dead", "list", "--json", "--limit", "7", "--reason", "aborted").stdout)

    # Then each comes once, and a limit or a reason is honoured
    assert Counter(d["id"] for d in listed) == Counter({f"default-{i:06d}": 1 for i in range(1500)})
    assert len(first) == 7 and {d["reason"] for d in first} == {"aborted"}
    assert "1,500 dead letters shown" in fleet.producer("dead", "list").stdout

    # When the truncated ones are replayed, then each of them is published once and leaves the store
    result = fleet.producer("dead", "requeue", "--reason", "truncated", "--yes")
    assert "requeued 750 prompts" in result.stdout
    assert queue_depth(client, QUEUE) == 1 + 750
    assert DeadLetters(client, "default").stats() == {"aborted": 750}
    assert {d["reason"] for d in fleet.dead_letters()} == {"aborted"}

    # When the rest are purged, then the store is empty and their prompts stay dead
    assert "purged 750 dead letters" in fleet.producer("dead", "purge", "--yes").stdout
    assert fleet.dead_letters() == [] and Ledger(client, "default").tally().dead == 750
