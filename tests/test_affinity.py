"""Affinity against real processes: a conversation stays on its server, a loaded server loses its prompts.

Real stand-ins (with their prefix caches), real workers and the real producer:
the `server` column of every stored row says where each turn or prompt was
generated, which is what a user checks.
"""
from __future__ import annotations

import signal
import threading
from collections import defaultdict

import httpx
import redis

from contract.keys import RunKeys

from conftest import write_prompts
from waiting import health_rounds, wait_until

SLOW = ("--step-base", "0.02", "--output-len-median", "30", "--output-len-max", "120")
SYSTEM = " ".join(f"Rule {i}: answer in plain words, cite the step you use, and check the result." for i in range(12))


def conversation_records(n: int, turns: int) -> list[dict]:
    records = []
    for i in range(n):
        messages = []
        for t in range(turns):
            messages += [{"role": "user", "content": f"Conversation {i}, question {t}: what is {i} * {t + 3}?"},
                         {"role": "assistant", "content": "original"}]
        records.append({"id": f"c-{i:03d}", "messages": messages})
    return records


def test_a_conversations_turns_stay_on_one_server_across_a_worker_restart(fleet, tmp_path):
    # Given two stand-ins, a worker bound to both, and conversations of four turns
    _, a = fleet.standin(*SLOW)
    _, b = fleet.standin(*SLOW)
    first = fleet.worker("first", [a, b], FLEET_SHUTDOWN_GRACE="20")
    fleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", conversation_records(8, 4))),
                   "--turns", "all", "--max-new-tokens", "256")
    # When the worker is stopped with the conversations part done, and another one takes over,
    # bound to the same servers listed the other way round (so load alone would place turns anew)
    wait_until(lambda: fleet.counters().get("state:done", 0) >= 8, 120, "a quarter of the turns", fleet)
    first.signal(signal.SIGTERM)
    first.popen.wait(60)
    fleet.worker("second", [b, a])
    wait_until(lambda: fleet.counters().get("conversations_complete", 0) == 8, 240, "every conversation", fleet)

    # Then every turn is stored, and every conversation's turns were generated on one server
    assert fleet.states() == {"done": 32} and fleet.dead_letters() == []
    servers, workers = defaultdict(set), defaultdict(set)
    for row in fleet.rows():
        servers[row["conversation"]].add(row["server"])
        workers[row["conversation"]].add(row["worker"].split("@")[0])
    assert all(len(found) == 1 for found in servers.values()), dict(servers)
    # (conversations on both servers, and some whose turns both workers generated: the restart
    # fell inside them)
    assert set().union(*servers.values()) == {a, b}
    assert any(found == {"first", "second"} for found in workers.values()), dict(workers)
    # and the later turns found their history in the server's prefix cache
    assert sum(_cached_tokens(url) for url in (a, b)) > 0
    # and the record of each conversation's server went with the conversation
    assert not redis.Redis.from_url(fleet.redis_url).exists(RunKeys("default").conversation_server)


def test_a_server_loaded_beyond_the_margin_loses_its_affinity_to_the_least_loaded(fleet, tmp_path):
    # Given two stand-ins of batch 4 and a worker bound to both
    _, a = fleet.standin("--max-running-requests", "4", *SLOW)
    _, b = fleet.standin("--max-running-requests", "4", *SLOW)
    fleet.worker("w", [a, b])
    # and prompts under one long system prompt, sent one at a time, that all went to one server
    for i in range(2):
        fleet.producer("enqueue", str(write_prompts(tmp_path / f"p{i}.jsonl", [_under_system(f"before-{i}")])),
                       "--max-new-tokens", "256")
        fleet.wait_finished()
    before = {row["id"]: row["server"] for row in fleet.rows()}
    sticky = before["before-0"]
    assert before["before-1"] == sticky
    other = b if sticky == a else a

    # When another client fills that server far beyond its batch, and the worker has read its load
    flood = threading.Thread(target=_flood, args=(sticky, 48), daemon=True)
    flood.start()
    wait_until(lambda: _waiting(sticky) >= 8, 60, "a queue on the sticky server", fleet)
    health_rounds(fleet.redis_url, 2, fleet=fleet)
    # and more prompts under the same system prompt arrive
    later = [_under_system(f"after-{i}") for i in range(3)]
    fleet.producer("enqueue", str(write_prompts(tmp_path / "later.jsonl", later)), "--max-new-tokens", "256")
    fleet.wait_finished()

    # Then load wins: they were generated on the other server
    after = {row["id"]: row["server"] for row in fleet.rows() if row["id"].startswith("after-")}
    assert after == {f"after-{i}": other for i in range(3)}
    flood.join(120)


def _under_system(prompt_id: str) -> dict:
    return {"id": prompt_id, "messages": [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": f"{prompt_id}: what is 6 * 7?"}]}


def _flood(url: str, count: int) -> None:
    """`count` requests straight to the server, all at once, as another client would send them."""
    def one(i: int) -> None:
        httpx.post(f"{url}/generate", json={"input_ids": [100 + i, 200, 300, 400], "rid": f"flood-{i}",
                                            "sampling_params": {"max_new_tokens": 120}}, timeout=300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)


def _waiting(url: str) -> int:
    loads = httpx.get(f"{url}/v1/loads", timeout=10).json()["loads"]
    return sum(entry["num_waiting_reqs"] for entry in loads)


def _cached_tokens(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("sglang:cached_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{url}/metrics has no sglang:cached_tokens_total")
